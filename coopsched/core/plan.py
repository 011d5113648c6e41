"""A tick's plan: what the scheduler decided, for the executor to run and commit to book.

The scheduler makes it (`schedule()`), the executor runs it on a backend, and
`commit(plan, outcome, start, end)` books the result. Rows are live Request
objects; `job` is the speculative job the tick serves, if any.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .request import Request
from .spec import SpecJob
from .types import ActionKind, TickKind, TickState


class Span(NamedTuple):
    """Prompt positions [start, stop) of a request that a prefill tick prefills."""
    request: Request
    start: int
    stop: int

    @property
    def is_whole(self) -> bool:
        return self.start == 0 and self.stop == len(self.request.prompt_token_ids)


@dataclass(slots=True)
class Plan:  # a slotted class: made every tick, read ~30 times (a NamedTuple is slower at both)
    action: ActionKind
    kind: TickKind
    state: TickState                     # what the policy decided from
    request_ids: tuple[str, ...] = ()    # the rows the tick record names
    rows: tuple[Request, ...] = ()       # classic rows: the admitted head, or the decode batch
    job: SpecJob | None = None
    release: tuple[str, ...] = ()        # rows finished before the tick (cancels): caches to free
    spans: tuple[Span, ...] = ()         # a prefill tick: what each row prefills (chunks under a budget)

    @property
    def runs_to_completion(self) -> bool:
        return self.kind is TickKind.BURST
