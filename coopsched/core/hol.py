"""Head-of-line waits: how long classic rows with pending work wait on speculative ticks.

Booked per tick in a few (wait, rows) groups, never per queued request: work per tick
follows the groups, not the queue length. One sample per stretch of speculative ticks.
"""

from __future__ import annotations

Samples = list[tuple[float, int]]  # (wait ms, how many rows waited it)


class _Joined:
    """Requests that joined the queue between the same two ticks of a stretch."""
    __slots__ = ("count", "wait")

    def __init__(self) -> None:
        self.wait = 0.0
        self.count = 0


class HolBook:
    """A classic row with pending work (a decode-batch row, or a queued request) waits while a
    speculative tick runs; its wait ends at the next classic tick (which serves the batch and
    may admit; a tick that only parks a waiter serves nobody and ends no wait). Queued requests
    wait in every speculative tick; batch rows in every one except a fused tick (which decodes
    them). Every batch row has waited the same since the batch was last served, every request
    queued before the stretch began the same, and every request that joined between the same two
    ticks the same: so a stretch ends in a few (wait, count) pairs, each summed tick by tick
    exactly as a per-row sum would be. A request that arrived while a tick ran joins before that
    tick's books in a group of its own, started at minus the part of the tick before it arrived.
    Ended waits collect in `samples` until the scheduler takes them (`take_samples`)."""

    def __init__(self) -> None:
        self.samples: Samples = []  # waits ended since the last take
        self._queue_wait = 0.0   # of every request queued before this stretch began
        self._batch_wait = 0.0   # of every decode-batch row since the batch was last served
        self._joined: list[_Joined] = []
        self._group_of: dict[str, _Joined] = {}
        self._open: _Joined | None = None  # the group arrivals join until the next speculative tick

    @property
    def has_waits(self) -> bool:
        """Whether a classic tick has anything to end (a speculative tick ran, or requests joined)."""
        return bool(self._queue_wait or self._batch_wait or self._joined)

    def join_queue(self, seq_id: str, into_tick_ms: float = 0.0) -> None:
        """A request joins the queue; `into_tick_ms` > 0: it arrived that long after the running tick
        began, so its group starts at minus that and the tick's wall leaves it exactly its own part."""
        if into_tick_ms > 0:
            group = _Joined()
            group.wait = -into_tick_ms
            self._joined.append(group)
        else:
            if self._open is None:
                self._open = _Joined()
                self._joined.append(self._open)
            group = self._open
        group.count += 1
        self._group_of[seq_id] = group

    def take_samples(self) -> Samples:
        samples, self.samples = self.samples, []
        return samples

    def leave_queue(self, seq_id: str) -> None:
        """A request leaves the queue (admitted, parked, cancelled): its wait so far ends."""
        group = self._group_of.pop(seq_id, None)
        if group is None:
            self._sample(self._queue_wait, 1)
        else:
            group.count -= 1
            self._sample(group.wait, 1)

    def leave_batch(self) -> None:
        """A batch row leaves before the batch is next served (cancelled, failed)."""
        self._sample(self._batch_wait, 1)

    def spec_tick(self, wall_ms: float, batch_waits: bool) -> None:
        self._queue_wait += wall_ms
        for group in self._joined:
            group.wait += wall_ms
        self._open = None
        if batch_waits:
            self._batch_wait += wall_ms

    def end_batch_wait(self, num_batch: int) -> None:
        """The batch was served: each of its rows' waits ends."""
        if self._batch_wait:
            self._sample(self._batch_wait, num_batch)
            self._batch_wait = 0.0

    def end_queue_wait(self, num_queued: int) -> None:
        """A classic tick ends the stretch for every queued request."""
        if not self._queue_wait and not self._joined:
            return
        self._sample(self._queue_wait, num_queued - sum(g.count for g in self._joined))
        for group in self._joined:
            self._sample(group.wait, group.count)
        self._queue_wait = 0.0
        self._joined, self._group_of, self._open = [], {}, None

    def _sample(self, wait_ms: float, count: int) -> None:
        if wait_ms > 0 and count > 0:
            self.samples.append((wait_ms, count))
