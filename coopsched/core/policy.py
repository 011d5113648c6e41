"""Tick policies: each mode decides one action per tick from a small frozen state.

`decide_action` is the upstream rule (under contention speculative rounds and classic actions
strictly alternate; alone, the round takes every tick). A mode is a `TickPolicy` registered in
coopsched/core/modes/; the scheduler asks its policy and never tests the mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

from .plan import Plan
from .request import Request
from .spec import SpecJob
from .types import ActionKind, SpecStats, TickRecord, TickState

__all__ = ["ActionKind", "Decision", "SchedulerView", "TickPolicy", "TickState", "decide_action",
           "next_yield_flag", "wants_prefill"]


class Decision(NamedTuple):
    action: ActionKind
    block_size: int | None = None  # K for this tick's round; None: the job's own


class SchedulerView(Protocol):
    """What a policy may read of the scheduler (never write)."""
    @property
    def running(self) -> Sequence[Request]: ...
    @property
    def job(self) -> SpecJob | None: ...
    @property
    def backlog(self) -> Iterable[SpecJob]: ...
    @property
    def requests(self) -> Mapping[str, Request]: ...
    def spec_stats(self, seq_id: str) -> SpecStats | None: ...


class TickPolicy(Protocol):
    keeps_slot: bool  # a speculative request keeps the slot until it ends, in one tick (the legacy burst)

    def decide(self, state: TickState, view: SchedulerView) -> Decision: ...

    def observe(self, plan: Plan, spec_rows: Sequence[str], record: TickRecord, view: SchedulerView) -> None:
        """Learn from a committed tick (`spec_rows`: the rows that did speculative work), before its
        finished rows are finalized."""


DECIDED = {action: Decision(action) for action in ActionKind}  # a policy's plain answers, made once


def wants_prefill(state: TickState) -> bool:
    """A prefill is due: an admission fits the batch, or a chunked prefill is under way, and
    (chunking) no prefill ran since the decode rows were last served."""
    can_admit = state.num_running < state.max_batch_size and state.num_admissible > 0
    can_prefill = can_admit or state.has_chunked_prefill
    return can_prefill and not (state.prefill_yields and state.num_running > 0)


def decide_action(state: TickState) -> ActionKind:
    has_classic_work = state.num_running > 0 or state.num_admissible > 0 or state.has_chunked_prefill
    if state.has_spec_work and (not has_classic_work or not state.last_was_spec):
        return ActionKind.SPEC_ROUND
    if not has_classic_work:
        return ActionKind.IDLE
    if wants_prefill(state):
        return ActionKind.PREFILL
    if state.num_running > 0:
        return ActionKind.DECODE
    return ActionKind.PREFILL


# SpeculativeRound sets the flag; Prefill, Decode and Fused clear it; Idle leaves it
YIELD_FLAG = {ActionKind.SPEC_ROUND: True, ActionKind.PREFILL: False, ActionKind.DECODE: False,
              ActionKind.FUSED: False}


def next_yield_flag(last_was_spec: bool, action: ActionKind) -> bool:
    """The yield flag after `action` (YIELD_FLAG; Idle leaves it)."""
    return YIELD_FLAG.get(action, last_was_spec)
