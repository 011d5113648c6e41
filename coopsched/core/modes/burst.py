"""burst: the legacy run-to-completion dispatch (the head-of-line block the harness must catch).

Decides as upstream's tick rule today does, but a speculative admission runs every
round of the request inside its one Prefill tick.
"""

from __future__ import annotations

from typing import Any

from ..plan import Plan
from ..policy import Decision, SchedulerView, decide_today
from ..types import Outcome, TickRecord, TickState


class BurstPolicy:
    is_sliced = False
    follows_upstream = True

    def __init__(self, config: Any) -> None:
        self.grant_interval = config.prefill_grant_interval
        self.mixed_step = config.mixed_step

    def decide(self, state: TickState, view: SchedulerView) -> Decision:
        return decide_today(state, self.grant_interval, self.mixed_step)

    def observe(self, plan: Plan, outcome: Outcome, record: TickRecord, view: SchedulerView) -> None:
        pass
