"""The prefill queue: three priority lanes, FIFO within a lane, O(1) per operation.

A removed request (cancelled) is only marked and skipped when it reaches the
front, so reaping never scans a lane. With `shape_key`, speculative requests are
also indexed by shape, so a batched window finds its siblings without a scan.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterator
from itertools import islice

from .request import Priority, Request

ShapeKey = Callable[[Request], Hashable]


class PrefillQueue:
    def __init__(self, shape_key: ShapeKey | None = None) -> None:
        self._lanes: dict[Priority, deque[Request]] = {p: deque() for p in Priority}
        self._removed: set[Request] = set()
        self._count = 0
        self._shape_key = shape_key
        self._shapes: dict[Hashable, dict[Priority, dict[Request, None]]] = {}

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Request]:
        for priority in Priority:
            yield from (r for r in self._lanes[priority] if r not in self._removed)

    def push(self, request: Request) -> None:
        self._lanes[request.priority].append(request)
        self._count += 1
        if self._shape_key is not None and request.speculative:
            lanes = self._shapes.setdefault(self._shape_key(request), {p: {} for p in Priority})
            lanes[request.priority][request] = None

    def peek(self) -> Request | None:
        for priority in Priority:
            lane = self._lanes[priority]
            while lane and lane[0] in self._removed:
                self._removed.discard(lane.popleft())
            if lane:
                return lane[0]
        return None

    def pop(self) -> Request:
        head = self.peek()
        if head is None:
            raise IndexError("pop from an empty prefill queue")
        self._lanes[head.priority].popleft()
        self._forget(head)
        return head

    def remove(self, request: Request) -> None:
        self._removed.add(request)
        self._forget(request)

    def siblings(self, head: Request, limit: int) -> list[Request]:
        """Up to `limit` queued speculative requests of the head's shape, in queue order."""
        if self._shape_key is None:
            return []
        lanes = self._shapes.get(self._shape_key(head), {})
        return list(islice((r for priority in Priority for r in lanes.get(priority, {})), limit))

    def _forget(self, request: Request) -> None:
        self._count -= 1
        if self._shape_key is not None and request.speculative:
            key = self._shape_key(request)
            self._shapes[key][request.priority].pop(request, None)
            if not any(self._shapes[key].values()):
                del self._shapes[key]
