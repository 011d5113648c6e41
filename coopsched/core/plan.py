"""A tick's plan, its result and what commit booked: the messages of one tick.

`Scheduler.schedule()` makes a Plan (ids and numbers, nothing mutable), `Executor.run` returns
a Result (what the model produced per row, or which rows failed), `Scheduler.commit` books it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .backend import PrefillRow
from .types import ActionKind, TickDeltas, TickKind, TickRecord, TickState, TokenEvent

Prefill = PrefillRow  # prompt positions [start, stop) of one row, with or without the drafter


Decode = tuple[str, int]  # (seq_id, last_token): one classic token after it (a plain pair: made per row per tick)


class Verify(NamedTuple):
    """One speculative round: draft k - 1 tokens after `last_token`, verify k positions."""
    seq_id: str
    last_token: int
    k: int


class Plan(NamedTuple):
    """One tick's work. Each row list names its rows' work; the executor groups them into forwards
    (prefills first, then the draft and one forward over the verify and decode rows)."""
    action: ActionKind
    kind: TickKind
    state: TickState                      # what the policy decided from
    seq_ids: tuple[str, ...] = ()         # the rows the tick record names
    prefills: tuple[Prefill, ...] = ()
    decodes: tuple[Decode, ...] = ()
    verifies: tuple[Verify, ...] = ()
    job_ids: tuple[str, ...] = ()         # the speculative job's rows this tick serves (live when planned)
    prefill_batched: bool = True          # the prefill rows share one forward (else one call each)
    prefill_tokens: tuple[int, ...] = ()  # chunk ticks: prompt tokens planned per seq_ids (the record's)


class Result(NamedTuple):
    """What the model produced, per row list in plan order; a failed call ends the lists where it
    failed, and `failed` names the rows it was for."""
    firsts: Sequence[int | None] = ()       # per prefill row: its first token once its prompt is all in
    tokens: Sequence[int] = ()              # per decode row
    drafts: Sequence[Sequence[int]] = ()    # per verify row
    targets: Sequence[Sequence[int]] = ()   # per verify row: k target tokens
    error: str | None = None
    failed: tuple[str, ...] = ()


EMPTY_RESULT = Result()


@dataclass(slots=True)
class Committed:
    """What `Scheduler.commit` booked: the tick's record, events and counter deltas, and what the
    executor must apply (rewinds, releases). `continues`: the tick goes on (a burst keeps the slot:
    its next round, `Scheduler.next_round`, runs before the tick's events are made)."""
    record: TickRecord
    events: list[TokenEvent]
    deltas: TickDeltas
    plan: Plan
    rewinds: list[tuple[str, int]]   # (seq_id, rejected positions to drop from the target cache)
    releases: list[str]              # finished rows: free their caches
    continues: bool = False
