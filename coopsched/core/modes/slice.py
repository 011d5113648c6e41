"""slice: one speculative round per tick; rounds and classic actions strictly alternate.

Upstream's tick-cooperative fix. A drafter kind that cannot be sliced (dflash)
still runs each speculative request whole, as upstream does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..plan import Plan
from ..policy import DECIDED, Decision, SchedulerView, decide_action
from ..types import TickRecord, TickState


class SlicePolicy:
    def __init__(self, config: Any) -> None:
        self.keeps_slot = config.draft_kind == "dflash"

    def decide(self, state: TickState, view: SchedulerView) -> Decision:
        return DECIDED[decide_action(state)]

    def observe(self, plan: Plan, spec_rows: Sequence[str], record: TickRecord, view: SchedulerView) -> None:
        pass
