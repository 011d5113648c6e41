"""Judging a server that reports no costs: each request (or kind) runs alone first, then together.

Together, a request's TTFT and its largest gap must stay within SOLO_MULTIPLE x its solo figure
+ SOLO_SLACK_MS (of SOLO_RUNS runs alone: the worst TTFT, the median largest gap); a gap's limit is
never above a ceiling (half the shortest solo run of another request: a wait that long could hold
half its reply) nor below SOLO_SLACK_MS. `--target` and the locust file share these.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from harness.live import client, stalls
from harness.run import metrics

SOLO_MULTIPLE = 3.0
SOLO_SLACK_MS = 25.0
SOLO_RUNS = 3
RULE = (f"TTFT and largest gap <= {SOLO_MULTIPLE:g} x the solo figure + {SOLO_SLACK_MS:g} ms (of {SOLO_RUNS} runs: "
        f"the worst TTFT, the median largest gap; a gap at most half another request's shortest solo run, "
        f"at least {SOLO_SLACK_MS:g} ms)")


def solo_limit(ms: float, ceiling_ms: float | None = None) -> float:
    return solo_limit_of(ms, ceiling_ms).ms


@dataclass(frozen=True)
class SoloLimit:
    """A limit from a solo figure: SOLO_MULTIPLE x figure + slack, at most the ceiling, at least the floor."""
    figure_ms: float
    ms: float
    floor_ms: float
    ceiling_ms: float | None

    def describe(self) -> str:
        raw = SOLO_MULTIPLE * self.figure_ms + SOLO_SLACK_MS
        ceiling = "none" if self.ceiling_ms is None else f"{self.ceiling_ms:.1f}"
        return (f"{SOLO_MULTIPLE:g} x {self.figure_ms:.1f} + {SOLO_SLACK_MS:g} = {raw:.1f}, floor "
                f"{self.floor_ms:.1f}, ceiling {ceiling}: {self.ms:.1f} ms")

    def to_json(self) -> dict:
        return {"figure_ms": round(self.figure_ms, 3), "limit_ms": round(self.ms, 3),
                "floor_ms": round(self.floor_ms, 3),
                "ceiling_ms": None if self.ceiling_ms is None else round(self.ceiling_ms, 3)}


def solo_limit_of(ms: float, ceiling_ms: float | None = None) -> SoloLimit:
    """The limit, its floor (SOLO_SLACK_MS: a wait may always take the slack) and its ceiling when
    given (half the shortest solo run of another request: a longer limit could hide half of that
    request's reply inside one wait, and a wait under its limit is never examined). The ceiling
    wins over the figure: under load one solo gap of 92 ms made a limit of 117 ms that the legacy
    burst's 83 ms gap stayed under; a wait over a tight limit is still only charged by the stall rule."""
    limit = SOLO_MULTIPLE * ms + SOLO_SLACK_MS
    if ceiling_ms is not None:
        limit = min(limit, ceiling_ms)
    return SoloLimit(ms, max(limit, SOLO_SLACK_MS), SOLO_SLACK_MS, ceiling_ms)


def ceiling_ms(other_lives_ms) -> float | None:
    """Half the shortest solo run (sent to last token) among the other requests, if any."""
    lives = [v for v in other_lives_ms if v]
    return min(lives) / 2 if lives else None


@dataclass(frozen=True)
class SoloFigures:
    """One request alone: TTFT and largest token gap (ms), tokens, and whether it finished."""
    ttft_ms: float | None
    stall_ms: float | None
    num_tokens: int
    error: str | None = None
    max_tokens_per_event: int = 1   # R of the stall rule (harness/live/stalls.py): one round's tokens
    pace_ms: float | None = None    # ms per token alone (the stall rule's pace: stalls.pace_ms)
    life_ms: float | None = None    # sent to last token (the shortest run)

    def to_json(self) -> dict:
        return {"ttft_ms": self.ttft_ms, "stall_ms": self.stall_ms, "num_tokens": self.num_tokens,
                "error": self.error, "max_tokens_per_event": self.max_tokens_per_event, "pace_ms": self.pace_ms,
                "life_ms": self.life_ms}


def figures(got: client.Collected) -> SoloFigures:
    times = got.token_times_ms(got.sent_ns)
    stall = max(metrics.itl(times), default=0.0) if times else None
    pace = stalls.pace_ms([stalls.Stream.of("solo", "solo", got)])
    return SoloFigures(times[0] if times else None, stall, len(times), got.error, max(got.counts, default=1), pace,
                       times[-1] if times else None)


def median(values) -> float | None:
    """The median of the values that are not None (None if there are none): one solo run frozen by
    the machine (a 1,609 ms gap at load 7) does not set the figure."""
    known = sorted(v for v in values if v is not None)
    return float(statistics.median(known)) if known else None


def measure(base: str, body: dict, *, path: str = "/v1/completions", timeout_s: float = 300.0,
            runs: int = SOLO_RUNS) -> SoloFigures:
    """Stream one request alone `runs` times: its largest gap is the median of them, its TTFT the worst."""
    alone = [figures(client.collect(base, body, path=path, timeout_s=timeout_s)) for _ in range(runs)]
    paces = [f.pace_ms for f in alone if f.pace_ms]
    worst = max((f.ttft_ms for f in alone if f.ttft_ms is not None), default=None)  # as Solo.ttft_ms
    return SoloFigures(worst, median(f.stall_ms for f in alone),
                       min(f.num_tokens for f in alone), next((f.error for f in alone if f.error), None),
                       max(f.max_tokens_per_event for f in alone), min(paces, default=None),
                       min((f.life_ms for f in alone if f.life_ms), default=None))
