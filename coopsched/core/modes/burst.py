"""burst: the legacy run-to-completion dispatch (the head-of-line block the harness must catch).

Decides as upstream's tick policy does, but a speculative admission runs every
round of the request inside its one Prefill tick.
"""

from __future__ import annotations

from typing import Any

from ..plan import Plan
from ..policy import DECIDED, Decision, SchedulerView, decide_action
from ..types import Outcome, TickRecord, TickState


class BurstPolicy:
    is_sliced = False

    def __init__(self, config: Any = None) -> None:
        pass

    def decide(self, state: TickState, view: SchedulerView) -> Decision:
        return DECIDED[decide_action(state)]

    def observe(self, plan: Plan, outcome: Outcome, record: TickRecord, view: SchedulerView) -> None:
        pass
