"""Fused mode: the classic decode rows and the speculative verify rows in ONE forward.

With speculative work pending and classic rows running, every classic tick is a
Fused tick: the drafter runs first, then `backend.fused` decodes the classic rows
and verifies the job's rows together, so a classic row never waits on a round and
its stall is one fused step. Admissions still come first (as in every mode), and
a slice 0 (a prefill) cannot share the decode forward: it takes its own tick.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .policy import ActionKind, TickState, decide_action

if TYPE_CHECKING:
    from .scheduler import Executed, Scheduler


def decide_fused(state: TickState) -> ActionKind:
    """Admission first; then a fused step while classic rows run; a lone job takes every tick."""
    if not state.has_spec_work:
        return decide_action(state)
    if state.num_running < state.max_batch_size and state.num_admissible > 0:
        return ActionKind.PREFILL
    if state.num_running > 0:
        return ActionKind.FUSED
    return ActionKind.SPEC_ROUND


class _FusedView:
    """The backend as a SpecJob sees it during a fused tick: its verify also decodes the classic rows."""

    def __init__(self, backend, decode_rows: list[tuple[str, int]]) -> None:
        self._backend = backend
        self.eos_token_id = backend.eos_token_id
        self.decode_rows = decode_rows
        self.classic_tokens: list[int] | None = None

    def draft(self, rows: Sequence[tuple[str, int]], num_tokens: int) -> list[list[int]]:
        return self._backend.draft(rows, num_tokens)

    def verify(self, rows: Sequence[tuple[str, int, Sequence[int]]]) -> list[list[int]]:
        self.classic_tokens, targets = self._backend.fused(self.decode_rows, rows)
        return targets

    def rewind(self, seq_id: str, num_tokens: int) -> None:
        self._backend.rewind(seq_id, num_tokens)


def run_fused(sched: "Scheduler") -> "Executed":
    """One fused tick (or the granted job's slice 0, which is a prefill and runs alone)."""
    from .scheduler import Executed

    if sched.job is None:
        sched.job = sched.backlog.grant()
        sched.obs.grant_log.append(",".join(sched.job.ids))
    job = sched.job
    if not job.is_begun:
        done = sched._spec_round()
        done.detail = "slice0"  # an admission: the classic bound allows it once, like any prefill
        return done
    rows = sched.running[: sched.config.max_batch_size]
    view = _FusedView(sched.backend, [(r.id, r.last_token) for r in rows])
    emissions = sched._run_slice(job, lambda _backend, detokenize: job.step(view, detokenize))
    if view.classic_tokens is None:  # every speculative row was cancelled before its draft
        view.classic_tokens = sched.backend.decode(view.decode_rows) if rows else []
    emissions += [sched._commit_classic(r, t) for r, t in zip(rows, view.classic_tokens)]
    return Executed(ActionKind.FUSED, tuple(r.id for r in rows) + tuple(job.ids), "fused",
                    emissions, spec_worked=list(job.last_worked))
