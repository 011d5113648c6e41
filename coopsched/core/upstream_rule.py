"""Upstream's tick rule today, in its own terms: a pure function of a small frozen record.

`decide_upstream(state)` gives the choice and the decode-ticks counter the next tick must
carry (the counter rides with the choice, so no caller can apply one without the other);
`next_yielded` is the yield flag after a choice; `next_grant_index` is the rotation
backlog's grant order. The slice and burst policies map the scheduler's state onto these.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

MAX_COUNTER = 2**32 - 1      # the counter is an unsigned 32-bit integer that saturates
DEFAULT_GRANT_INTERVAL = 16  # decode ticks a chunked prompt yields before its chunk is granted
GRANT_SKIP_CAP = 2           # grant decisions an entry may be passed over before it is overdue


class Choice(str, enum.Enum):
    SPEC_ROUND = "spec_round"
    DECODE = "decode"
    MIXED = "mixed"      # the decode rows and one chunk of the chunked prompt in one forward
    PREFILL = "prefill"  # admit the queue head, or run one chunk of the chunked prompt
    IDLE = "idle"


class UpstreamState(NamedTuple):
    """What the rule reads. Defaults are all-false and zero, as upstream's own record's are."""
    speculative_pending: bool = False  # an active speculative job or a non-empty backlog
    yielded: bool = False              # the previous action was a speculative round
    chunked: bool = False              # a prompt is being prefilled chunk by chunk
    batch_empty: bool = False          # no classic row decodes
    batch_full: bool = False
    queue_empty: bool = False          # nothing waits to be admitted
    should_preempt: bool = False       # preemption enabled and a higher priority waits (never here)
    mixed_step: bool = False           # the mixed step is enabled
    decode_ticks: int = 0              # decode ticks won against the chunked prompt since its last chunk
    grant_interval: int = 0            # decode ticks it yields before a chunk is granted; 0: never


class UpstreamDecision(NamedTuple):
    choice: Choice
    decode_ticks: int  # the counter the next tick's state must carry


def grant_due(state: UpstreamState) -> bool:
    """The chunked prompt is owed its chunk: it has yielded `grant_interval` decode ticks (0 never)."""
    return state.grant_interval > 0 and state.decode_ticks >= state.grant_interval


def decide_upstream(state: UpstreamState) -> UpstreamDecision:
    choice = _choose(state)
    return UpstreamDecision(choice, next_decode_ticks(state, choice))


def _choose(state: UpstreamState) -> Choice:
    if state.speculative_pending:
        others_have_work = state.chunked or not state.batch_empty or not state.queue_empty
        if not others_have_work or not state.yielded:
            return Choice.SPEC_ROUND
    if state.chunked:  # nothing else is admitted while a prompt is chunked
        if state.batch_empty:
            return Choice.PREFILL
        if state.mixed_step:  # outranks the grant: every tick already runs a chunk
            return Choice.MIXED
        return Choice.PREFILL if grant_due(state) else Choice.DECODE
    if state.batch_empty and state.queue_empty:
        return Choice.IDLE
    if not state.batch_empty:
        if state.should_preempt or (not state.batch_full and not state.queue_empty):
            return Choice.PREFILL
        return Choice.DECODE
    return Choice.PREFILL


def next_decode_ticks(state: UpstreamState, choice: Choice) -> int:
    """0 with no chunked prompt or after its chunk ran; +1 (saturating) after a decode; else kept."""
    if not state.chunked or choice in (Choice.PREFILL, Choice.MIXED):
        return 0
    if choice is Choice.DECODE:
        return min(state.decode_ticks + 1, MAX_COUNTER)
    return state.decode_ticks  # a round moves neither workload (Idle cannot happen while chunked)


def next_yielded(yielded: bool, choice: Choice) -> bool:
    """A round sets the flag; Prefill (a slice 0 or a parked waiter too), Decode and Mixed clear it;
    Idle leaves it."""
    if choice is Choice.SPEC_ROUND:
        return True
    return yielded if choice is Choice.IDLE else False


def next_grant_index(entries: Sequence[tuple[int, int]], skip_cap: int = GRANT_SKIP_CAP) -> int | None:
    """The backlog entry the next grant picks, from each entry's (priority, skips) in ring order.

    Priority: a smaller number is a higher lane (coopsched's Priority). An entry passed over by
    `skip_cap` grant decisions is overdue: the most-skipped overdue entry wins, the earliest on a
    tie, whatever its lane; otherwise the highest lane wins, the earliest within it.
    """
    if not entries:
        return None
    overdue = [(-skips, i) for i, (_, skips) in enumerate(entries) if skips >= skip_cap]
    if overdue:
        return min(overdue)[1]
    return min((priority, i) for i, (priority, _) in enumerate(entries))[1]
