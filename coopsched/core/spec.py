"""Speculative jobs: a B = 1 session or a B > 1 window, with state owned by the job.

`begin` is slice 0 (prefill + first token); `step` is exactly one round; the
acceptance walk (DESIGN.md section 3) is `accept_walk`. The job calls the
backend protocol but never a clock: its caller times each slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .backend import ModelBackend
from .commit import Detokenize, commit_tokens
from .request import FinishReason, Request, RequestState


def accept_walk(drafts: Sequence[int], targets: Sequence[int], budget: int) -> tuple[list[int], int]:
    """Tokens one round emits and the number of drafts accepted.

    `accepted` = index of the first draft that differs from the target (all if none);
    the round emits drafts[:accepted] + [targets[accepted]] cut to `budget` (so the
    correction token is dropped first).
    """
    if len(targets) != len(drafts) + 1:
        raise ValueError(f"verify returned {len(targets)} targets for {len(drafts)} drafts")
    accepted = next((i for i, (d, t) in enumerate(zip(drafts, targets)) if d != t), len(drafts))
    emitted = list(drafts[:accepted]) + [targets[accepted]]
    return emitted[: max(budget, 0)], accepted


@dataclass(slots=True)
class SpecStats:
    """Per-request counters, reported in its BurstFinalized record."""
    slices: int = 0          # ticks it did model work in (1 for a legacy burst)
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    wall_ms: float = 0.0     # longest single tick it occupied
    active_ms: float = 0.0   # sum of its slice walls
    hol_waiters: int = 0     # most classic rows waiting on it at once


@dataclass(frozen=True, slots=True)
class Emission:
    """Tokens a tick made visible for one request, and whether that finished it."""
    seq_id: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None = None


@dataclass(eq=False, slots=True)
class SpecJob:
    rows: list[Request]
    block_size: int
    stats: dict[str, SpecStats] = field(default_factory=dict)
    is_begun: bool = False
    grant_slices: int = 0   # slices since its current grant (rotation)
    skips: int = 0          # grants it lost while parked (rotation)
    last_worked: list[str] = field(default_factory=list)  # rows that did model work last slice

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

    def begin(self, backend: ModelBackend, detokenize: Detokenize) -> list[Emission]:
        """Slice 0: prefill every row, then commit each first token (a failed prefill commits none)."""
        rows = self.live_rows
        for request in rows:
            request.state = RequestState.SPECULATIVE
            request.served_speculatively = True
        firsts = [backend.prefill(r.id, r.prompt_token_ids, r.sampling, True) for r in rows]
        self.is_begun = True
        out = [_commit(r, [first], backend.eos_token_id, detokenize) for r, first in zip(rows, firsts)]
        self.grant_slices += 1
        self.last_worked = [r.id for r in rows]
        return out

    def step(self, backend: ModelBackend, detokenize: Detokenize) -> list[Emission]:
        """Exactly one round over every live row; a cancelled row stops before any draft."""
        out = []
        self.last_worked = []
        for request in self.live_rows:
            if request.is_cancelled:
                request.state = RequestState.FINISHED
                request.finish_reason = FinishReason.STOP
                out.append(Emission(request.id, (), FinishReason.STOP))
        rows = self.live_rows
        if not rows:
            return out
        for request in rows:  # a job re-granted after rotation comes back from PARKED
            request.state = RequestState.SPECULATIVE
        num_drafts = self.block_size - 1
        drafts = backend.draft([(r.id, r.last_token) for r in rows], num_drafts)
        targets = backend.verify([(r.id, r.last_token, d) for r, d in zip(rows, drafts)])
        for request, row_drafts, row_targets in zip(rows, drafts, targets):
            emitted, accepted = accept_walk(row_drafts, row_targets, request.num_remaining)
            stats = self.stats[request.id]
            stats.rounds += 1
            stats.drafted += num_drafts
            stats.accepted += min(accepted, num_drafts)
            emission = _commit(request, emitted, backend.eos_token_id, detokenize)
            if emission.finish_reason is None:
                backend.rewind(request.id, num_drafts - accepted)
            out.append(emission)
        self.grant_slices += 1
        self.last_worked = [r.id for r in rows]
        return out


def _commit(request: Request, tokens: Sequence[int], eos: int, detokenize: Detokenize) -> Emission:
    committed, reason = commit_tokens(request, tokens, eos, detokenize)
    if reason is not None:
        request.state = RequestState.FINISHED
        request.finish_reason = reason
    return Emission(request.id, tuple(committed), reason)
