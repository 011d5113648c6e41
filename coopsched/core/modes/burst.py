"""burst: the legacy run-to-completion dispatch (the head-of-line block the harness must catch).

Decides as upstream's tick rule today does, but keeps the slot: a speculative admission runs every
round of the request inside its one Prefill tick (the engine repeats run + commit).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..plan import Plan
from ..policy import Decision, SchedulerView, decide_today
from ..types import TickRecord, TickState


class BurstPolicy:
    keeps_slot = True
    follows_upstream = True

    def __init__(self, config: Any) -> None:
        self.grant_interval = config.prefill_grant_interval
        self.mixed_step = config.mixed_step

    def decide(self, state: TickState, view: SchedulerView) -> Decision:
        return decide_today(state, self.grant_interval, self.mixed_step)

    def observe(self, plan: Plan, spec_rows: Sequence[str], record: TickRecord, view: SchedulerView) -> None:
        pass
