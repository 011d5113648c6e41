"""The scheduler's books: counters, HOL waits, grants and BurstFinalized records.

HOL waits are kept as a multiset (wait -> rows): memory grows with distinct waits, not ticks x
queue. A server keeps no history (`keep_history`): it exports each tick's TickDeltas instead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .types import BurstFinalized


@dataclass(slots=True)
class BatchObservability:
    keep_history: bool = True   # grant log, BurstFinalized list, HOL waits (runs); a server exports deltas instead
    rounds: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    slices: int = 0
    hol_wait_ms: Counter[float] = field(default_factory=Counter)  # wait -> rows that waited it
    hol_waiters_max: int = 0
    waiter_parks: int = 0       # Prefill ticks that only parked a waiter (the yield-flag quirk)
    prefill_grants: int = 0     # chunks granted to a chunked prompt beside decode rows (slice, burst)
    mixed_steps: int = 0
    grant_log: list[str] = field(default_factory=list)
    bursts: list[BurstFinalized] = field(default_factory=list)

    def log_grant(self, entry: str) -> None:
        if self.keep_history:
            self.grant_log.append(entry)

    def add_burst(self, record: BurstFinalized) -> None:
        if self.keep_history:
            self.bursts.append(record)

    def add_hol_waits(self, samples: list[tuple[float, int]]) -> None:
        if not self.keep_history:
            return
        for wait, count in samples:
            self.hol_wait_ms[wait] += count
