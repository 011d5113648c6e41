"""Clocks the engine injects: virtual (a manual clock advanced by charged cost) and real.

Both read in ms. `sleep` is how a mock backend pays its cost: exact in virtual
time, precise in real time (sleep most of it, then short sleeps that release the GIL).
"""

from __future__ import annotations

import time


class ManualClock:
    kind = "virtual"

    def __init__(self, start_ms: float = 0.0) -> None:
        self._now = start_ms

    def now(self) -> float:
        return self._now

    def sleep(self, ms: float) -> None:
        if ms < 0:
            raise ValueError(f"cannot sleep a negative time ({ms} ms)")
        self._now += ms

    def advance_to(self, t_ms: float) -> None:
        self._now = max(self._now, t_ms)


class RealClock:
    kind = "real"
    _FINE_MS = 0.2  # the last stretch is waited out in short sleeps, never a busy loop

    def __init__(self) -> None:
        self._origin_ns = time.perf_counter_ns()

    def now(self) -> float:
        return (time.perf_counter_ns() - self._origin_ns) / 1e6

    def to_ns(self, ms: float) -> int:
        """A reading of this clock as perf_counter_ns (CLOCK_MONOTONIC on Linux: comparable across
        processes, so a client can subtract it from its own arrival times)."""
        return self._origin_ns + round(ms * 1e6)

    def sleep(self, ms: float) -> None:
        """Sleep precisely without holding the GIL: a spinning worker thread starves the
        server's event loop (every GIL hand-off can wait a whole switch interval)."""
        deadline = self.now() + ms
        if ms > self._FINE_MS:
            time.sleep((ms - self._FINE_MS) / 1e3)
        while (left := deadline - self.now()) > 0:
            time.sleep(min(left, 0.05) / 1e3)

    def advance_to(self, t_ms: float) -> None:
        wait = t_ms - self.now()
        if wait > 0:
            self.sleep(wait)
