"""Chunked and batched prefill: which prompt positions one prefill tick covers.

A prefill tick has a token budget (`prefill_chunk_tokens`; 0 = unlimited) and a
row cap (`max_batch_prefill` for classic admissions; a window's rows for slice 0).
Rows are served in order, each taking what is left of its prompt up to what is
left of the budget, so a prompt longer than the budget spans several ticks and
no tick prefills more than the budget. Pure: the scheduler applies the spans.
"""

from __future__ import annotations

from collections.abc import Iterable

from .plan import Span
from .request import Request
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

    def take(self, request: Request) -> Span:
        """The next span of the request's prompt that fits (the budget must have room)."""
        start = request.num_prefilled
        remaining = len(request.prompt_token_ids) - start
        size = remaining if self.num_tokens is None else min(remaining, self.num_tokens)
        if self.num_tokens is not None:
            self.num_tokens -= size
        self.num_rows -= 1
        return Span(request, start, start + size)


def spans_for(requests: Iterable[Request], budget: Budget) -> list[Span]:
    """Spans for the requests in order while the budget has room (finished prompts skipped)."""
    out = []
    for request in requests:
        if not budget.has_room:
            break
        if request.num_prefilled < len(request.prompt_token_ids):
            out.append(budget.take(request))
    return out


def prefill_kind(spans: Iterable[Span], whole: TickKind) -> TickKind:
    """`whole` when every prompt is prefilled from start to end in this tick, else CHUNK."""
    return whole if all(s.is_whole for s in spans) else TickKind.CHUNK
