"""The capacity search of `calibrate --report`: from the highest ladder rate that met the SLO, double
the rate until the live server misses it, then bisect (the geometric midpoint) between the highest
rate that met and the lowest that missed, at most `rungs` rates. A rung's arrivals span QUEUE_SPAN x
the SLO's TTFT bound, so a queue can outgrow that bound, at every rate: a rung of a fixed count
would judge a fast server on a burst it absorbs (256 requests over 0.7 s met a 2 s TTFT on a server
that serves 80/s). MAX_RUNG_REQUESTS only bounds a rung's live time past 500/s.
No I/O here: the caller's function runs a rung, live and on the twins.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from harness.run.slo import Slo
from harness.sweep.points import EPS

RUNGS = 6                 # rates tried at most (calibrate --capacity-rungs; 0 skips the search)
QUEUE_SPAN = 4.0          # a rung's arrivals span this x the SLO's TTFT bound ...
SPAN_WITHOUT_TTFT_S = 8.0  # ... or this long when the SLO bounds no TTFT
MAX_RUNG_REQUESTS = 4096  # the live time's bound: a rung sends at most this many requests
RESOLUTION = 0.1          # stop once the lowest rate that missed is within 10% of the highest that met


class GiveUp:
    """A live rung's way out: once more of its requests have waited past the SLO's TTFT bound for
    their first token than the attainment allows to miss, the rung has missed whatever comes next,
    so the client stops sending and cuts the streams still open. A rung past a llama-server's
    capacity took 73-115 s to drain its 866-1029 requests (every token wakes every waiting
    request's HTTP thread), with the machine's load at 81; the verdict was known seconds in.
    `gave_up_after` records how many requests had been sent when it did (None: it ran out)."""

    def __init__(self, ttft_ms: float, requests: int, attainment: float) -> None:
        self.ttft_ms = ttft_ms
        self.allowed = math.floor((1.0 - attainment) * requests + EPS)  # misses the rung may have and meet
        self.gave_up_after: int | None = None

    @classmethod
    def of(cls, slo: Slo, requests: int, attainment: float) -> GiveUp | None:
        return None if slo.ttft_ms is None else cls(slo.ttft_ms, requests, attainment)

    def hopeless(self, waited_ms: Iterable[float]) -> bool:
        """Whether the rung has missed: each sent request's TTFT, or its wait so far without one."""
        return sum(w > self.ttft_ms for w in waited_ms) > self.allowed


@dataclass(frozen=True)
class Step:
    """One rate of the search: how many requests, the span of their arrivals, how long the live run
    took (first arrival to last token), and each side's share of requests that met the SLO."""
    rate_per_s: float
    requests: int
    arrivals_s: float
    live_s: float
    attained: dict[str, float | None]  # {"live": share, "twin": share, "before": share}
    gave_up_after: int | None = None   # the live run stopped, hopeless, with this many requests sent

    def met(self, side: str, attainment: float) -> bool:
        got = self.attained[side]
        return got is not None and got >= attainment - EPS

    def to_json(self) -> dict:
        r3 = lambda v: None if v is None else round(v, 4)
        return {"rate_per_s": self.rate_per_s, "requests": self.requests, "arrivals_s": r3(self.arrivals_s),
                "live_s": r3(self.live_s), "slo_attainment": r3(self.attained["live"]),
                **({"gave_up_after_requests": self.gave_up_after} if self.gave_up_after is not None else {}),
                **{f"{side}_slo_attainment": r3(v) for side, v in self.attained.items() if side != "live"}}


def rung_requests(rate_per_s: float, slo: Slo, at_least: int) -> int:
    """Enough requests that their arrivals span QUEUE_SPAN x the TTFT bound (at least `at_least`,
    at most MAX_RUNG_REQUESTS: a fast server's rung then spans less, which the rung records)."""
    span_s = QUEUE_SPAN * slo.ttft_ms / 1000.0 if slo.ttft_ms is not None else SPAN_WITHOUT_TTFT_S
    return min(MAX_RUNG_REQUESTS, max(at_least, math.ceil(rate_per_s * span_s)))


def next_rate(steps: Sequence[Step], floor: float, attainment: float, side: str = "live") -> float | None:
    """Double past the highest rate that met while none missed; halve (not under `floor`, the light
    rate) while none met; else bisect the bracket; None once it is within RESOLUTION or cannot move.
    `side` is whose attainment steers it: the live server's, or a twin's own search."""
    met = [s.rate_per_s for s in steps if s.met(side, attainment)]
    missed = [s.rate_per_s for s in steps if not s.met(side, attainment)]
    low, high = max(met, default=None), min(missed, default=None)
    if high is None:
        return round(2 * low, 3)
    if low is None:
        rate = max(floor, round(high / 2, 3))
        return rate if rate < high else None
    rate = round(math.sqrt(low * high), 3)
    return rate if high / low - 1 > RESOLUTION and low < rate < high else None


def search(run: Callable[[float, int], Step], start: float, floor: float, slo: Slo, at_least: int,
           rungs: int, attainment: float, say: Callable[[str], None], log: Callable[[str], None]) -> list[Step]:
    """At most `rungs` rates from `start`, each `run(rate, requests)` once: `say` what runs, `log` a
    line per rung run."""
    steps: list[Step] = []
    rate: float | None = start
    while rate is not None and len(steps) < rungs:
        requests = rung_requests(rate, slo, at_least)
        say(f"capacity rung {len(steps) + 1}/{rungs}: {rate:g} req/s, {requests} requests")
        step = run(rate, requests)
        steps.append(step)
        log(step_line(step, len(steps), rungs, attainment))
        rate = next_rate(steps, floor, attainment)
    return steps


def step_line(step: Step, index: int, rungs: int, attainment: float) -> str:
    share = lambda v: "-" if v is None else f"{v:.0%}"
    verdict = "met" if step.met("live", attainment) else "missed"
    if step.gave_up_after is not None:
        verdict += f", given up after {step.gave_up_after} sent"
    twins = ", ".join(f"{side} {share(v)}" for side, v in step.attained.items() if side != "live")
    return (f"capacity rung {index}/{rungs}: {step.rate_per_s:g} req/s, {step.requests} requests arriving over "
            f"{step.arrivals_s:.1f} s: live {share(step.attained['live'])} {verdict} (took {step.live_s:.1f} s); "
            f"{twins}")


def refine(predict: Callable[[float, int], float | None], side: str, tried: Sequence[Step], floor: float,
           slo: Slo, at_least: int, rungs: int, attainment: float) -> list[Step]:
    """A twin's own search, in virtual time, on from the rates the live search tried (`tried`, each with
    the twin's attainment under `side`): the same doubling and bisection, steered by the twin's
    attainment (`predict(rate, requests)`), at most `rungs` more rates. Without it a twin's capacity is
    only as fine as the live server's rates: a twin that misses the first searched rate falls back to
    the ladder's light one."""
    steps = list(tried)
    more: list[Step] = []
    while len(more) < rungs and (rate := next_rate(steps, floor, attainment, side)) is not None:
        requests = rung_requests(rate, slo, at_least)
        step = Step(rate, requests, requests / rate, 0.0, {side: predict(rate, requests)})
        steps.append(step)
        more.append(step)
    return more
