"""Speculative jobs: a B = 1 session or a B > 1 window, its state and the acceptance walk.

The scheduler starts a job's slices when it plans them and finishes them when it commits the
model's results: slice 0 is prefill + first token (maybe in chunks); a round drafts K - 1
tokens and verifies K positions. A job calls no model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .append import Vocab, append
from .request import Request, RequestState
from .types import FinishReason, SpecStats, TokenEvent


def accept_walk(drafts: Sequence[int], targets: Sequence[int], budget: int) -> tuple[list[int], int]:
    """Tokens one round emits and the number of drafts accepted.

    `accepted` = index of the first draft that differs from the target (all if none);
    the round emits drafts[:accepted] + [targets[accepted]] cut to `budget` (so the
    correction token is dropped first).
    """
    if len(targets) != len(drafts) + 1:
        raise ValueError(f"verify returned {len(targets)} targets for {len(drafts)} drafts")
    accepted = 0
    for draft, target in zip(drafts, targets):
        if draft != target:
            break
        accepted += 1
    emitted = [*drafts[:accepted], targets[accepted]]
    return emitted[: max(budget, 0)], accepted


@dataclass(eq=False, slots=True)
class SpecJob:
    rows: list[Request]
    block_size: int
    stats: dict[str, SpecStats] = field(default_factory=dict)
    is_begun: bool = False
    grant_slices: int = 0   # slices since its current grant (rotation)
    skips: int = 0          # grants it lost while parked (rotation)
    last_worked: list[str] = field(default_factory=list)  # rows that did model work last slice
    firsts: dict[str, int] = field(default_factory=dict)  # chunked slice 0: first tokens of rows done early

    def __post_init__(self) -> None:
        for request in self.rows:
            self.stats.setdefault(request.id, SpecStats())

    @property
    def ids(self) -> list[str]:
        return [r.id for r in self.rows]

    @property
    def live_rows(self) -> list[Request]:
        return [r for r in self.rows if not r.is_finished]

    @property
    def is_done(self) -> bool:
        return self.is_begun and not self.live_rows

    @property
    def is_window(self) -> bool:
        return len(self.rows) > 1

    def start_slice0(self) -> list[Request]:
        """The rows whose prompts slice 0 prefills (with the drafter)."""
        rows = self.live_rows
        for request in rows:
            request.state = RequestState.SPECULATIVE
            request.served_speculatively = True
        return rows

    def stop_cancelled(self) -> list[str]:
        """Cancelled rows finish before the slice does any model work for them (failed ones with
        their error)."""
        stopped = []
        for request in self.rows:
            if request.is_cancelled and not request.is_finished:
                request.state = RequestState.FINISHED
                request.finish_reason = FinishReason.ERROR if request.error else FinishReason.STOP
                self.firsts.pop(request.id, None)
                stopped.append(request.id)
        return stopped

    def finish_chunk(self, rows: list[Request], done: Sequence[tuple[str, int | None]], vocab: Vocab,
                     time_ms: float) -> list[TokenEvent]:
        """Slice 0 ran for `done` (seq_id, first token if its prompt is now all in). Once every row
        has its first token slice 0 ends: each row's first token is appended, all at once."""
        for seq_id, first in done:
            if first is not None:
                self.firsts[seq_id] = first
        if rows and all(r.id in self.firsts for r in rows):
            self.is_begun = True
            self.grant_slices += 1
            self.last_worked = [r.id for r in rows]
            events = []
            for request in rows:
                tokens, reason = append(request, [self.firsts.pop(request.id)], vocab)
                events.append(TokenEvent(request.id, tokens, time_ms, reason))
            return events
        self.grant_slices += 1
        self.last_worked = [seq_id for seq_id, _ in done]
        return []

    def start_round(self) -> tuple[list[str], list[Request]]:
        """Cancelled rows stop before any draft; returns them and the rows to draft."""
        self.last_worked = []
        stopped = self.stop_cancelled()
        rows = self.live_rows
        for request in rows:  # a job re-granted after rotation comes back from PARKED
            request.state = RequestState.SPECULATIVE
        return stopped, rows

    def finish_round(self, rows: Sequence[Request], drafts: Sequence[Sequence[int]],
                     targets: Sequence[Sequence[int]], vocab: Vocab,
                     time_ms: float) -> tuple[list[TokenEvent], list[tuple[str, int]], int]:
        """Walk acceptance per row, then append what each row may emit; returns the events, the
        rejected positions to rewind per row, and the drafts accepted."""
        num_drafts = self.block_size - 1
        # every row's verify width is checked before any row is appended to
        walks = [accept_walk(d, t, r.num_remaining) for r, d, t in zip(rows, drafts, targets)]
        events, rewinds, accepted_total = [], [], 0
        for request, (emitted, accepted) in zip(rows, walks):
            stats = self.stats[request.id]
            stats.rounds += 1
            stats.drafted += num_drafts
            stats.accepted += min(accepted, num_drafts)
            accepted_total += min(accepted, num_drafts)
            tokens, reason = append(request, emitted, vocab)
            events.append(TokenEvent(request.id, tokens, time_ms, reason))
            if reason is None:
                rewinds.append((request.id, num_drafts - accepted))
        self.grant_slices += 1
        self.last_worked = [r.id for r in rows]
        return events, rewinds, accepted_total
