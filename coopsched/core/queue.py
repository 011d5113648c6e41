"""The prefill queue: three priority lanes, FIFO within a lane."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from .request import Priority, Request


class PrefillQueue:
    def __init__(self) -> None:
        self._lanes: dict[Priority, deque[Request]] = {p: deque() for p in Priority}

    def __len__(self) -> int:
        return sum(len(lane) for lane in self._lanes.values())

    def __iter__(self) -> Iterator[Request]:
        for priority in Priority:
            yield from self._lanes[priority]

    def push(self, request: Request) -> None:
        self._lanes[request.priority].append(request)

    def peek(self) -> Request | None:
        return next(iter(self), None)

    def pop(self) -> Request:
        for priority in Priority:
            if self._lanes[priority]:
                return self._lanes[priority].popleft()
        raise IndexError("pop from an empty prefill queue")

    def remove(self, request: Request) -> None:
        self._lanes[request.priority].remove(request)

    def take_where(self, keep: Callable[[Request], bool], limit: int) -> list[Request]:
        """Remove and return up to `limit` queued requests matching `keep`, in queue order."""
        taken = [r for r in self if keep(r)][:limit]
        for request in taken:
            self.remove(request)
        return taken
