"""slice: one speculative round per tick; rounds and classic actions strictly alternate.

Upstream's tick-cooperative fix, under its tick rule today (the prefill grant, the mixed
step). A drafter kind that cannot be sliced (dflash) still runs each speculative request
whole, as upstream does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..plan import Plan
from ..policy import Decision, SchedulerView, decide_today
from ..types import TickRecord, TickState


class SlicePolicy:
    follows_upstream = True

    def __init__(self, config: Any) -> None:
        self.keeps_slot = config.draft_kind == "dflash"
        self.grant_interval = config.prefill_grant_interval
        self.mixed_step = config.mixed_step

    def decide(self, state: TickState, view: SchedulerView) -> Decision:
        return decide_today(state, self.grant_interval, self.mixed_step)

    def observe(self, plan: Plan, spec_rows: Sequence[str], record: TickRecord, view: SchedulerView) -> None:
        pass
