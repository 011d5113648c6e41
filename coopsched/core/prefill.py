"""Chunked and batched prefill: which prompt positions one prefill tick covers.

A prefill tick has a token budget (`prefill_chunk_tokens`; 0 = whole prompts) and a row cap
(`max_batch_prefill` for classic admissions; a window's rows for slice 0). Rows are served in
order, each taking what is left of its prompt up to what is left of the budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .plan import Prefill
from .request import Request, RequestState
from .spec import SpecJob
from .types import TickKind


class Budget:
    """Prompt tokens and rows one prefill tick may still take."""
    __slots__ = ("num_rows", "num_tokens")

    def __init__(self, num_tokens: int, num_rows: int) -> None:
        self.num_tokens = num_tokens if num_tokens > 0 else None  # None: whole prompts
        self.num_rows = num_rows

    @property
    def has_room(self) -> bool:
        return self.num_rows > 0 and (self.num_tokens is None or self.num_tokens > 0)

    def take(self, request: Request, with_draft: bool) -> Prefill:
        """The next span of the request's prompt that fits (the budget must have room)."""
        start = request.num_prefilled
        remaining = len(request.prompt_token_ids) - start
        size = remaining if self.num_tokens is None else min(remaining, self.num_tokens)
        if self.num_tokens is not None:
            self.num_tokens -= size
        self.num_rows -= 1
        return Prefill(request.id, request.prompt_token_ids, start, start + size, request.sampling, with_draft)


def spans_for(requests: Iterable[Request], budget: Budget, with_draft: bool = False) -> list[Prefill]:
    """Spans for the requests in order while the budget has room (finished prompts skipped)."""
    out = []
    for request in requests:
        if not budget.has_room:
            break
        if request.num_prefilled < len(request.prompt_token_ids):
            out.append(budget.take(request, with_draft))
    return out


def is_whole(row: Prefill) -> bool:
    return row.start == 0 and row.stop == len(row.prompt)


def prefill_kind(spans: Iterable[Prefill], whole: TickKind) -> TickKind:
    """`whole` when every prompt is prefilled from start to end in this tick, else CHUNK."""
    return whole if all(is_whole(s) for s in spans) else TickKind.CHUNK


def slice0_spans(job: SpecJob, chunk_tokens: int, whole: TickKind) -> tuple[TickKind, tuple[Prefill, ...]]:
    """What this tick prefills of a job's slice 0: all of it (`whole`), or one chunk (CHUNK)."""
    rows = job.live_rows
    spans = spans_for(rows, Budget(chunk_tokens, len(rows)), with_draft=True)
    return (prefill_kind(spans, whole) if len(spans) == len(rows) else TickKind.CHUNK), tuple(spans)


def planned_tokens(spans: Sequence[Prefill], seq_ids: Sequence[str]) -> tuple[int, ...]:
    """Prompt tokens each row of a tick's record prefills (0 for a window row already done)."""
    done = {s.seq_id: s.stop - s.start for s in spans}
    return tuple(done.get(seq_id, 0) for seq_id in seq_ids)


def book_prefill(rows: Iterable[Request], running: list[Request], prefilling: list[Request]) -> None:
    """After a classic prefill tick: rows whose prompt is all in join the decode batch, the
    others wait in `prefilling` (rows that ended, in their first token or failed, are skipped)."""
    for request in rows:
        if request.is_finished:
            continue
        if request.num_prefilled == len(request.prompt_token_ids):
            if request.state is RequestState.PREFILLING:
                prefilling.remove(request)
            request.state = RequestState.RUNNING
            running.append(request)
        elif request.state is not RequestState.PREFILLING:
            request.state = RequestState.PREFILLING
            prefilling.append(request)
