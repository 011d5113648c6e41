"""Backend failures scoped to the requests they hit.

A backend that knows which rows of a call failed raises `BackendError(msg, seq_ids)`;
the rest of that call must then have had no effect. Any other exception a model call
raises is converted by `GuardedBackend` into a `BackendError` for every row of that
call. The scheduler finishes only those requests (FinishReason.ERROR) and keeps the
others going; exceptions from the scheduler's own logic are never caught.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .policy import ActionKind
from .request import FinishReason, Request, RequestState, SamplingParams
from .spec import Emission

if TYPE_CHECKING:
    from .scheduler import Executed, Scheduler


class BackendError(RuntimeError):
    """A model call failed for `seq_ids` (empty: for every row of the call)."""

    def __init__(self, message: str, seq_ids: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.seq_ids = tuple(seq_ids)


class GuardedBackend:
    """The backend as the scheduler sees it: model calls raise only BackendError."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.eos_token_id = inner.eos_token_id

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def prefill(self, seq_id: str, prompt: Sequence[int], params: SamplingParams, with_draft: bool) -> int:
        return _guard((seq_id,), self.inner.prefill, seq_id, prompt, params, with_draft)

    def decode(self, rows):
        return _guard([r[0] for r in rows], self.inner.decode, rows)

    def draft(self, rows, num_tokens: int):
        return _guard([r[0] for r in rows], self.inner.draft, rows, num_tokens)

    def verify(self, rows):
        return _guard([r[0] for r in rows], self.inner.verify, rows)

    def fused(self, decode_rows, verify_rows):
        ids = [r[0] for r in decode_rows] + [r[0] for r in verify_rows]
        return _guard(ids, self.inner.fused, decode_rows, verify_rows)

    def rewind(self, seq_id: str, num_tokens: int) -> None:
        self.inner.rewind(seq_id, num_tokens)

    def release(self, seq_id: str) -> None:
        self.inner.release(seq_id)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.inner.detokenize(token_ids)


def _guard(seq_ids: Sequence[str], call, *args):
    try:
        return call(*args)
    except BackendError as exc:
        exc.seq_ids = exc.seq_ids or tuple(seq_ids)
        raise
    except Exception as exc:  # the call cannot say for whom it failed: every row of it
        raise BackendError(f"{type(exc).__name__}: {exc}", seq_ids) from exc


def fail_tick(sched: "Scheduler", action: ActionKind, exc: BackendError) -> "Executed":
    """Finish the rows the failed call names with an error; every other row carries on.

    Model calls come before any commit within a slice, so the failed slice committed
    nothing; earlier slices of the tick (a burst) keep their emissions. A row the slice
    had already finished (a cancel reaped at the top of a round) still gets its event.
    """
    from .scheduler import Executed

    failed = [sched.requests[i] for i in exc.seq_ids if i in sched.requests]
    for request in failed:
        if not request.is_finished:
            request.state, request.finish_reason = RequestState.FINISHED, FinishReason.ERROR
            request.error = str(exc)
    emissions = list(sched._partial)
    finishing = {e.seq_id for e in emissions + sched._reaped if e.finish_reason is not None}
    job = sched.job
    touched: dict[str, Request] = {r.id: r for r in failed}
    touched.update((r.id, r) for r in (job.rows if job is not None else []))
    for request in touched.values():
        if request.is_finished and request.id not in finishing and request.id in sched.requests:
            emissions.append(Emission(request.id, (), request.finish_reason))
    if job is not None and not job.live_rows:
        sched.job = None
    elif job is not None and not job.is_begun:  # slice 0 failed for a sibling: retry it from scratch
        for request in job.live_rows:
            sched.backend.release(request.id)
    spec = [i for i in touched if i in sched._jobs]
    return Executed(action, tuple(touched), "error", emissions, spec_worked=spec)
