"""A fixed pool of KV slots: one per admitted sequence, each `slot_tokens` long.

Admission waits while the pool is full; a request longer than a slot can never
fit and is refused at submit time with a message that names the numbers.
"""

from __future__ import annotations

from collections.abc import Container

from .request import Request, RequestError


class KVSlotPool:
    def __init__(self, num_slots: int, slot_tokens: int) -> None:
        if num_slots < 1 or slot_tokens < 1:
            raise ValueError(f"KVSlotPool needs num_slots >= 1 and slot_tokens >= 1, "
                             f"got {num_slots} and {slot_tokens}")
        self.num_slots = num_slots
        self.slot_tokens = slot_tokens
        self._free = list(range(num_slots - 1, -1, -1))
        self._owner: dict[str, int] = {}

    @property
    def num_in_use(self) -> int:
        return len(self._owner)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def check_fits(self, request: Request) -> None:
        needed = len(request.prompt_token_ids) + request.max_tokens
        if needed > self.slot_tokens:
            raise RequestError(
                f"request {request.id!r} needs {needed} tokens of context "
                f"(prompt {len(request.prompt_token_ids)} + max_tokens {request.max_tokens}) "
                f"but a KV slot holds {self.slot_tokens}")

    def holds(self, seq_id: str) -> bool:
        return seq_id in self._owner

    def acquire(self, seq_id: str) -> int:
        if seq_id in self._owner:
            raise RuntimeError(f"sequence {seq_id!r} already holds KV slot {self._owner[seq_id]}")
        if not self._free:
            raise RuntimeError("KV slot pool exhausted: admission must wait for a free slot")
        slot = self._free.pop()
        self._owner[seq_id] = slot
        return slot

    def release(self, seq_id: str) -> None:
        slot = self._owner.pop(seq_id, None)
        if slot is not None:
            self._free.append(slot)


def check_queueable(request: Request, live: Container[str], kv: KVSlotPool) -> None:
    """Raise RequestError if the request can never be queued now: an empty prompt, an id already
    live, or more context than a KV slot holds."""
    if not request.prompt_token_ids:
        raise RequestError(f"request {request.id!r}: the prompt is empty; send at least one token")
    if request.id in live:
        raise RequestError(f"request id {request.id!r} is already live")
    kv.check_fits(request)
