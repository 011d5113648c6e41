"""Slot rotation (upstream's grant rotation): the speculative backlog and its grants.

The backlog holds fresh waiters (not yet begun) and expired jobs (parked with
their state). Grants go by priority lane then FIFO, but an entry skipped
`skip_cap` times is overdue: the most-skipped overdue entry wins (upstream's
order). Cancelled entries never wedge the ring: upstream's rule pops them at
their grant (which counts as a decision); fused and cost drop them at once.
"""

from __future__ import annotations

from collections.abc import Iterator

from .spec import SpecJob
from .upstream_rule import next_grant_index


class Backlog:
    def __init__(self, cap: int = 2, skip_cap: int = 2) -> None:
        self.cap = cap
        self.skip_cap = skip_cap
        self._entries: list[SpecJob] = []

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[SpecJob]:
        return iter(self._entries)

    @property
    def has_room(self) -> bool:
        """Whether a new waiter may park (an expired job always may)."""
        return len(self._entries) < self.cap

    def park(self, job: SpecJob) -> None:
        job.skips = 0
        self._entries.append(job)

    def drop_cancelled(self) -> list[SpecJob]:
        """Remove entries whose every row was cancelled; return them for finalizing."""
        dropped = [j for j in self._entries if all(r.is_cancelled or r.is_finished for r in j.rows)]
        self._entries = [j for j in self._entries if j not in dropped]
        return dropped

    def next_grant(self) -> SpecJob | None:
        """The entry the next grant would pick (nothing changes)."""
        index = next_grant_index([(min(r.priority for r in j.rows), j.skips) for j in self._entries],
                                 self.skip_cap)
        return None if index is None else self._entries[index]

    def grant(self) -> SpecJob | None:
        """Pop the winner of the next grant; every entry left behind counts a skip."""
        winner = self.next_grant()
        if winner is None:
            return None
        self._entries.remove(winner)
        for job in self._entries:
            job.skips += 1
        winner.grant_slices = 0
        return winner
