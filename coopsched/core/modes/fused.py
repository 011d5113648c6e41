"""fused: the classic decode rows and the speculative verify rows in ONE forward.

With speculative work pending and classic rows running, every classic tick is a Fused tick, so
a classic row never waits on a round. Admissions come first; a slice 0 takes its own tick.
"""

from __future__ import annotations

from ..policy import DECIDED, Decision, SchedulerView, decide_action, wants_prefill
from ..types import ActionKind, TickState
from .slice import SlicePolicy


def decide_fused(state: TickState) -> ActionKind:
    """Admission first; then a fused step while classic rows run; a lone job takes every tick.
    A slice 0 (a prefill) cannot share the decode forward: a chunked one alternates with decode."""
    if not state.has_spec_work:
        return decide_action(state)
    if wants_prefill(state):
        return ActionKind.PREFILL
    if state.spec_prefilling and state.num_running > 0:  # a chunk cannot be fused: alternate with decode
        return ActionKind.DECODE if state.last_was_spec else ActionKind.SPEC_ROUND
    if state.num_running > 0:
        return ActionKind.FUSED
    return ActionKind.SPEC_ROUND


class FusedPolicy(SlicePolicy):
    """Slice mode's rounds and bookkeeping; only the choice of action differs (its own rule)."""
    follows_upstream = False

    def decide(self, state: TickState, view: SchedulerView) -> Decision:
        return DECIDED[decide_fused(state)]
