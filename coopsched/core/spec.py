"""Speculative jobs: a B = 1 session or a B > 1 window, with its state and the acceptance walk.

A job never calls a model: the executor calls the backend and hands the results
to `finish_slice0` (the first tokens of a prefill) and `finish_round` (drafts and
target tokens of one round), which walk acceptance and commit tokens. Slice 0 is
prefill + first token; a round drafts K-1 tokens and verifies K positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from .commit import Detokenize, commit_tokens
from .request import Request, RequestState
from .types import Emission, FinishReason, SpecStats


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


class RoundResult(NamedTuple):
    """What one round committed, what the target cache must drop, and its counters."""
    emissions: list[Emission]
    rewinds: list[tuple[str, int]]   # (seq_id, rejected positions to drop)
    rounds: int
    drafted: int
    accepted: int


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

    def finish_slice0(self, rows: list[Request], firsts: Sequence[int], eos_token_id: int,
                      detokenize: Detokenize) -> list[Emission]:
        """Commit each row's first token (only after every prefill succeeded)."""
        self.is_begun = True
        out = [commit(r, [first], eos_token_id, detokenize) for r, first in zip(rows, firsts)]
        self.grant_slices += 1
        self.last_worked = [r.id for r in rows]
        return out

    def stop_cancelled(self) -> list[Emission]:
        """Cancelled rows finish before the slice does any model work for them."""
        stopped = []
        for request in self.rows:
            if request.is_cancelled and not request.is_finished:
                request.state = RequestState.FINISHED
                request.finish_reason = FinishReason.STOP
                self.firsts.pop(request.id, None)
                stopped.append(Emission(request.id, (), FinishReason.STOP))
        return stopped

    def finish_chunk(self, rows: list[Request], done: Sequence[tuple[str, int | None]], eos_token_id: int,
                     detokenize: Detokenize) -> list[Emission]:
        """One chunk of slice 0 ran for `done` (seq_id, first token if its prompt is now all in): a
        slice. Once every row has its first token, slice 0 ends as `finish_slice0` (all at once)."""
        for seq_id, first in done:
            if first is not None:
                self.firsts[seq_id] = first
        if rows and all(r.id in self.firsts for r in rows):
            return self.finish_slice0(rows, [self.firsts.pop(r.id) for r in rows], eos_token_id, detokenize)
        self.grant_slices += 1
        self.last_worked = [seq_id for seq_id, _ in done]
        return []

    def start_round(self) -> tuple[list[Emission], list[Request]]:
        """Cancelled rows stop before any draft; returns their finish emissions and the rows to draft."""
        self.last_worked = []
        stopped = self.stop_cancelled()
        rows = self.live_rows
        for request in rows:  # a job re-granted after rotation comes back from PARKED
            request.state = RequestState.SPECULATIVE
        return stopped, rows

    def finish_round(self, rows: list[Request], drafts: Sequence[Sequence[int]],
                     targets: Sequence[Sequence[int]], eos_token_id: int,
                     detokenize: Detokenize) -> RoundResult:
        """Walk acceptance per row, then commit what each row may emit."""
        num_drafts = self.block_size - 1
        # every row's verify width is checked before any row commits
        walks = [accept_walk(d, t, r.num_remaining) for r, d, t in zip(rows, drafts, targets)]
        emissions, rewinds, accepted_total = [], [], 0
        for request, (emitted, accepted) in zip(rows, walks):
            stats = self.stats[request.id]
            stats.rounds += 1
            stats.drafted += num_drafts
            stats.accepted += min(accepted, num_drafts)
            accepted_total += min(accepted, num_drafts)
            emission = commit(request, emitted, eos_token_id, detokenize)
            emissions.append(emission)
            if emission.finish_reason is None:
                rewinds.append((request.id, num_drafts - accepted))
        self.grant_slices += 1
        self.last_worked = [r.id for r in rows]
        return RoundResult(emissions, rewinds, len(rows), len(rows) * num_drafts, accepted_total)


def commit(request: Request, tokens: Sequence[int], eos_token_id: int, detokenize: Detokenize) -> Emission:
    """Commit tokens to a row (classic or speculative) and finish it when a rule says so."""
    committed, reason = commit_tokens(request, tokens, eos_token_id, detokenize)
    if reason is not None:
        request.state = RequestState.FINISHED
        request.finish_reason = reason
    return Emission(request.id, tuple(committed), reason)
