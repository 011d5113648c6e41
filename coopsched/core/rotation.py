"""Slot rotation (upstream's grant rotation): the speculative backlog and its grants.

The backlog holds fresh waiters and expired jobs (parked with their state). Grants go by priority
lane then FIFO, but an entry skipped `skip_cap` times wins; cancelled entries are dropped.
"""

from __future__ import annotations

from collections.abc import Iterator

from .spec import SpecJob


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
        if not self._entries:
            return None
        overdue = [j for j in self._entries if j.skips >= self.skip_cap]
        if overdue:
            return overdue[0]
        return min(self._entries, key=lambda j: (min(r.priority for r in j.rows), self._entries.index(j)))

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
