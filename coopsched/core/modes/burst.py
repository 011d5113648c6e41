"""burst: the legacy run-to-completion dispatch (the head-of-line block the harness must catch).

Decides as upstream's tick policy does, but keeps the slot: a speculative admission runs every
round of the request inside its one Prefill tick (the engine repeats run + commit).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..plan import Plan
from ..policy import DECIDED, Decision, SchedulerView, decide_action
from ..types import TickRecord, TickState


class BurstPolicy:
    keeps_slot = True

    def __init__(self, config: Any = None) -> None:
        pass

    def decide(self, state: TickState, view: SchedulerView) -> Decision:
        return DECIDED[decide_action(state)]

    def observe(self, plan: Plan, spec_rows: Sequence[str], record: TickRecord, view: SchedulerView) -> None:
        pass
