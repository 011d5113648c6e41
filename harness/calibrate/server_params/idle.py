"""idle_wake_ms: how much longer a lone request's TTFT is when the server sat idle before it than when
it comes straight after another. A server gone cold (its threads descheduled, its caches taken by
others) answers later: on llama-server (tiny model, one pinned core, 2026-12-07) a lone request sent
20 ms after the one before took 1.1 ms more than one sent straight after it, on a TTFT of 1 ms, and a
light open-loop workload finds the server idle at half its arrivals. A spinning process on either
core did not take it away, so it is the server's own state, not the machine's sleep states.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from itertools import accumulate

from harness.calibrate.target import Server, arrivals_ms, text_prompt

IDLE_MS = (2.0, 5.0, 10.0, 20.0, 50.0)  # the idle spans timed, beside none (straight after another)
IDLE_ROUNDS = 6                          # each span this many times, the spans in a rotated order each round


def idle_ttfts(server: Server, idle_ms: Sequence[float] = IDLE_MS,
               rounds: int = IDLE_ROUNDS) -> dict[float, list[float]]:
    """{idle ms: client TTFTs}: each timed request is sent `idle` ms after the end of one sent straight
    after another (so the span before it is the only idle); 0 is straight after."""
    spans = (0.0, *idle_ms)
    got: dict[float, list[float]] = {idle: [] for idle in spans}
    for r in range(rounds):
        for idle in spans[r % len(spans):] + spans[:r % len(spans)]:
            server.collect(server.body(text_prompt(16, f"idle:{r}:{idle}:warm"), 2, False))
            time.sleep(idle / 1000.0)
            times, _ = arrivals_ms(server.collect(server.body(text_prompt(16, f"idle:{r}:{idle}"), 2, False)))
            got[idle].extend(times[:1])
    return got


def idle_wake(ttfts: Mapping[float, Sequence[float]]) -> tuple[list[list[float]], str]:
    """The table: per idle span, the median TTFT less the median straight after another, never less
    than a shorter span's (a colder server is not faster: a dip is noise) nor 0; empty without
    TTFTs straight after another."""
    medians = {idle: statistics.median(v) for idle, v in sorted(ttfts.items()) if v}
    if 0.0 not in medians or len(medians) < 2:
        return [], "idle_wake_ms: no lone request was timed straight after another; none is charged"
    spans = [idle for idle in medians if idle > 0]
    extras = accumulate((max(medians[idle] - medians[0.0], 0.0) for idle in spans), max)
    table = [[idle, round(extra, 4)] for idle, extra in zip(spans, extras)]
    n = min(len(v) for v in ttfts.values())
    return table, (f"idle_wake_ms = {table}: a lone request's TTFT (median of {n}) after "
                   + "/".join(f"{idle:g}" for idle in medians) + " ms idle: "
                   + "/".join(f"{ms:.2f}" for ms in medians.values()) + " ms")

