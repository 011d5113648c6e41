"""The executor: runs a tick's plan on a model backend and returns what the model produced.

It mutates no request: the scheduler's commit books the Result. Every backend call is
contained: one that raises fails only the rows it was for (`BackendError(msg, seq_ids)` names
them; any other exception, every row of that call). coopsched's own errors are never caught.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .core.backend import ModelBackend
from .core.plan import EMPTY_RESULT, Plan, Prefill, Result

T = TypeVar("T")


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

    def run(self, plan: Plan) -> Result:
        """The plan's forwards in order: prefills, then the draft and one forward over the verify
        and decode rows (verify, fused or decode), each verify row over its own K positions. Prefills
        beside decode or verify rows are called `shared`: one forward a step (a mixed step), whose
        fixed cost the decode rows' forward pays where the cost model says so. A failed call ends
        the tick's model work."""
        backend = self.backend
        firsts: list[int | None] = []
        tokens: Sequence[int] = ()
        drafts: Sequence[Sequence[int]] = ()
        targets: Sequence[Sequence[int]] = ()
        try:
            verifies, decodes = plan.verifies, plan.decodes
            if plan.prefills:
                self._prefill(plan.prefills, plan.prefill_batched, bool(verifies or decodes), firsts)
            if verifies:
                ids = [v.seq_id for v in verifies]
                # one draft call at the longest row's K; a row of a smaller K keeps the head of its drafts
                drafted = guard(ids, backend.draft, [(v.seq_id, v.last_token) for v in verifies],
                                max(v.k for v in verifies) - 1)
                drafts = [d[:v.k - 1] for v, d in zip(verifies, drafted)]
                rows = [(v.seq_id, v.last_token, d) for v, d in zip(verifies, drafts)]
                if decodes:
                    tokens, targets = guard([seq_id for seq_id, _ in decodes] + ids, backend.fused, decodes, rows)
                else:
                    targets = guard(ids, backend.verify, rows)
            elif decodes:  # a decode step (a mixed step's, after its chunk: one forward on a backend that fuses)
                tokens = guard([seq_id for seq_id, _ in decodes], backend.decode, decodes)
                return Result(firsts, tokens)
        except BackendError as exc:
            return Result(firsts, tokens, drafts, targets, str(exc), exc.seq_ids)
        return Result(firsts, tokens, drafts, targets) if firsts or drafts else EMPTY_RESULT

    def _prefill(self, rows: Sequence[Prefill], batched: bool, shared: bool, firsts: list[int | None]) -> None:
        """One forward over the rows (a lone whole prompt as `prefill`), or one `prefill` each."""
        backend = self.backend
        if batched and not (len(rows) == 1 and rows[0].start == 0 and rows[0].is_last):
            firsts += guard([r.seq_id for r in rows], backend.prefill_batch, rows, shared)
            return
        for r in rows:
            firsts.append(guard((r.seq_id,), backend.prefill, r.seq_id, r.prompt, r.params, r.with_draft, shared))

    def apply(self, rewinds: Sequence[tuple[str, int]], releases: Sequence[str]) -> list[tuple[str, str]]:
        """What the commit decided: drop rejected draft positions, free finished rows' caches.
        Returns the rows whose rewind failed (seq_id, why): their caches are wrong, they must end."""
        failed = []
        for seq_id, num_tokens in rewinds:
            try:
                guard((seq_id,), self.backend.rewind, seq_id, num_tokens)
            except BackendError as exc:
                failed.append((seq_id, str(exc)))
        for seq_id in releases:
            try:
                guard((seq_id,), self.backend.release, seq_id)
            except BackendError as exc:  # the slot is freed anyway; kept for logs
                self.release_errors.append(f"release {seq_id}: {exc}")
        return failed
