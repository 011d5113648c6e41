"""The tick policy: `decide_action` picks exactly one action per tick.

A pure function of a small frozen record (DESIGN.md section 2): under
contention speculative rounds and classic actions strictly alternate; alone,
the speculative round takes every tick.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ActionKind(str, enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    SPEC_ROUND = "spec_round"
    FUSED = "fused"
    IDLE = "idle"


SPECULATIVE_KINDS = frozenset({ActionKind.SPEC_ROUND, ActionKind.FUSED})


@dataclass(frozen=True, slots=True)
class TickState:
    has_spec_work: bool = False      # an active job or a non-empty backlog
    num_running: int = 0             # classic rows in the decode batch
    max_batch_size: int = 8
    num_admissible: int = 0          # queued requests that could be admitted now (a KV slot is free)
    has_parked_prefill: bool = False  # a chunked prefill in progress (none in this reference)
    last_was_spec: bool = False      # the yield flag


def decide_action(state: TickState) -> ActionKind:
    has_classic_work = state.num_running > 0 or state.num_admissible > 0 or state.has_parked_prefill
    if state.has_spec_work and (not has_classic_work or not state.last_was_spec):
        return ActionKind.SPEC_ROUND
    if not has_classic_work:
        return ActionKind.IDLE
    if state.num_running < state.max_batch_size and state.num_admissible > 0:
        return ActionKind.PREFILL
    if state.num_running > 0:
        return ActionKind.DECODE
    return ActionKind.PREFILL


def next_yield_flag(last_was_spec: bool, action: ActionKind) -> bool:
    """SpeculativeRound sets the flag; Prefill, Decode and Fused clear it; Idle leaves it."""
    if action is ActionKind.IDLE:
        return last_was_spec
    return action is ActionKind.SPEC_ROUND
