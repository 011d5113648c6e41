"""The executor: runs a tick's plan on a model backend and returns its Outcome.

Every backend call of a tick happens here, the legacy burst loop included, and
every one is contained: a call that raises fails only the rows it was for
(`BackendError(msg, seq_ids)` names them; any other exception fails every row of
that call), the rest of the tick's rows carry on, and the scheduler's commit
books whatever the tick did. Exceptions from coopsched's own logic are never caught.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .core.backend import ModelBackend, PrefillRow
from .core.plan import Plan, Span
from .core.request import Request, RequestState
from .core.spec import SpecJob, commit
from .core.types import ActionKind, Emission, FinishReason, Outcome, TickKind

T = TypeVar("T")
NONE_ENDED: frozenset[str] = frozenset()
CLASSIC_WORK = (TickKind.DECODE, TickKind.ADMIT, TickKind.CHUNK, TickKind.MIXED)  # a tick without a job


class BackendError(RuntimeError):
    """A model call failed for `seq_ids` (empty: for every row of the call)."""

    def __init__(self, message: str, seq_ids: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.seq_ids = tuple(seq_ids)


def guard(seq_ids: Sequence[str], call: Callable[..., T], *args: Any) -> T:
    """Run one model call; any failure becomes a BackendError naming the rows it was for."""
    try:
        return call(*args)
    except BackendError as exc:
        exc.seq_ids = exc.seq_ids or tuple(seq_ids)
        raise
    except Exception as exc:  # the call cannot say for whom it failed: every row of it
        raise BackendError(f"{type(exc).__name__}: {exc}", seq_ids) from exc


class Executor:
    def __init__(self, backend: ModelBackend) -> None:
        self.backend = backend
        self.release_errors: list[str] = []  # a failed release frees the slot anyway; kept for logs

    def run(self, plan: Plan) -> Outcome:
        out = Outcome()
        job = plan.job
        # a window's rows that finished before the tick: containment leaves them be
        ended_before = frozenset(r.id for r in job.rows if r.is_finished) if job is not None else NONE_ENDED
        try:
            self._run(plan, out)
        except BackendError as exc:
            self._contain(plan, out, exc, ended_before)
        for seq_id in plan.release:
            self._release(seq_id)
        for emission in out.emissions:
            if emission.finish_reason is not None:
                self._release(emission.seq_id)
        return out

    # -- the plan's work --------------------------------------------------------
    def _run(self, plan: Plan, out: Outcome) -> None:
        job, kind = plan.job, plan.kind
        if job is None:  # classic rows only: a decode step, or an admission's prefill
            if kind in CLASSIC_WORK:
                self._classic(plan, out)
            return
        if kind is TickKind.PARK:
            return
        if kind is TickKind.CHUNK:
            self._chunk(plan, job, out)
        elif not job.is_begun:
            self._slice0(job, out)
            while plan.runs_to_completion and job.live_rows:
                self._round(job, out)
        elif kind is TickKind.FUSED:
            self._round(job, out, classic=list(plan.rows))
        else:
            self._round(job, out)
        # an admission tick books every row of the new job; a round, the rows that drafted
        out.spec_rows = tuple(job.ids) if plan.action is ActionKind.PREFILL else tuple(job.last_worked)

    def _classic(self, plan: Plan, out: Outcome) -> None:
        rows = plan.rows
        if plan.kind is TickKind.DECODE or plan.kind is TickKind.MIXED:  # the decode rows, then (mixed) a chunk
            tokens = guard([r.id for r in rows], self.backend.decode, [(r.id, r.last_token) for r in rows])
            out.emissions += self._commit_classic(rows, tokens)
            if plan.kind is TickKind.DECODE:
                return
        firsts = self._prefill(plan.spans, with_draft=False)  # rows whose prompt is all in get a token
        done = [(s.request, first) for s, first in zip(plan.spans, firsts) if first is not None]
        out.emissions += self._commit_classic([r for r, _ in done], [t for _, t in done])

    def _prefill(self, spans: Sequence[Span], with_draft: bool) -> list[int | None]:
        """One prefill call: a lone whole prompt as `prefill`, anything else as ONE `prefill_batch`.
        Each row's prefilled count moves only once the call succeeded."""
        if not spans:
            return []
        if len(spans) == 1 and spans[0].is_whole:
            r = spans[0].request
            firsts: list[int | None] = [guard((r.id,), self.backend.prefill, r.id, r.prompt_token_ids,
                                              r.sampling, with_draft)]
        else:
            rows = [PrefillRow(s.request.id, s.request.prompt_token_ids, s.start, s.stop, s.request.sampling,
                               with_draft) for s in spans]
            firsts = guard([s.request.id for s in spans], self.backend.prefill_batch, rows)
        for span in spans:
            span.request.num_prefilled = span.stop
        return firsts

    def _slice0(self, job: SpecJob, out: Outcome) -> None:
        rows = job.start_slice0()
        firsts = [guard((r.id,), self.backend.prefill, r.id, r.prompt_token_ids, r.sampling, True)
                  for r in rows]
        for request in rows:
            request.num_prefilled = len(request.prompt_token_ids)
        out.emissions += job.finish_slice0(rows, firsts, self.backend.eos_token_id, self.backend.detokenize)

    def _chunk(self, plan: Plan, job: SpecJob, out: Outcome) -> None:
        """One chunk of a speculative job's slice 0 (its rows' prompts, with the drafter)."""
        out.emissions += job.stop_cancelled()
        rows = job.start_slice0()
        spans = [s for s in plan.spans if not s.request.is_finished]
        firsts = self._prefill(spans, with_draft=True)
        done = [(s.request.id, first) for s, first in zip(spans, firsts)]
        out.emissions += job.finish_chunk(rows, done, self.backend.eos_token_id, self.backend.detokenize)

    def _round(self, job: SpecJob, out: Outcome, classic: list[Request] | None = None) -> None:
        """One round of the job; in a fused tick its verify also decodes the classic rows."""
        stopped, rows = job.start_round()
        out.emissions += stopped
        decode_rows = [(r.id, r.last_token) for r in classic] if classic is not None else []
        classic_tokens: list[int] = []
        if rows:
            num_drafts = job.block_size - 1
            ids = [r.id for r in rows]
            drafts = guard(ids, self.backend.draft, [(r.id, r.last_token) for r in rows], num_drafts)
            verify_rows = [(r.id, r.last_token, d) for r, d in zip(rows, drafts)]
            if classic is None:
                targets = guard(ids, self.backend.verify, verify_rows)
            else:
                classic_tokens, targets = guard([r for r, _ in decode_rows] + ids, self.backend.fused,
                                                decode_rows, verify_rows)
            result = job.finish_round(rows, drafts, targets, self.backend.eos_token_id,
                                      self.backend.detokenize)
            out.emissions += result.emissions
            out.rounds += result.rounds
            out.drafted += result.drafted
            out.accepted += result.accepted
            for seq_id, num_tokens in result.rewinds:
                guard((seq_id,), self.backend.rewind, seq_id, num_tokens)
        elif decode_rows:  # every speculative row was cancelled before its draft
            classic_tokens = guard([r for r, _ in decode_rows], self.backend.decode, decode_rows)
        if classic is not None:
            out.emissions += self._commit_classic(classic, classic_tokens)

    def _commit_classic(self, rows: Sequence[Request], tokens: list[int]) -> list[Emission]:
        eos_token_id, detokenize = self.backend.eos_token_id, self.backend.detokenize
        return [commit(r, [t], eos_token_id, detokenize) for r, t in zip(rows, tokens)]

    # -- containment ------------------------------------------------------------
    def _contain(self, plan: Plan, out: Outcome, exc: BackendError, ended_before: frozenset[str]) -> None:
        """Finish the rows the failed call names with an error; every other row carries on.

        Model calls come before any commit within a slice, so the failed slice committed
        nothing but a round's rewinds (its tokens are already in `out`); earlier slices of
        the tick (a burst) keep their emissions. A row the slice had already finished (a
        cancel reaped at the top of a round) still gets its finish event.
        """
        job = plan.job
        job_rows = job.rows if job is not None and plan.kind is not TickKind.PARK else []
        by_id = {r.id: r for r in [*plan.rows, *(s.request for s in plan.spans), *job_rows]}
        failed = [by_id[i] for i in exc.seq_ids if i in by_id]
        for request in failed:
            if not request.is_finished:
                request.state, request.finish_reason = RequestState.FINISHED, FinishReason.ERROR
                request.error = str(exc)
        finishing = {e.seq_id for e in out.emissions if e.finish_reason is not None} | set(plan.release) | ended_before
        touched = {r.id: r for r in failed} | {r.id: r for r in job_rows}
        for request in touched.values():
            if request.is_finished and request.id not in finishing:
                out.emissions.append(Emission(request.id, (), request.finish_reason))
        if job is not None and job_rows and job.live_rows and not job.is_begun:
            job.firsts.clear()
            for request in job.live_rows:  # slice 0 failed for a sibling: the rest retry it from scratch
                self._release(request.id)
                request.num_prefilled = 0
        out.error = str(exc)
        out.failed = tuple(r.id for r in failed)
        out.touched = tuple(touched)
        out.spec_rows = tuple(i for i in touched if i in {r.id for r in job_rows} and i not in ended_before)

    def _release(self, seq_id: str) -> None:
        try:
            guard((seq_id,), self.backend.release, seq_id)
        except BackendError as exc:
            self.release_errors.append(f"release {seq_id}: {exc}")
