"""Judging a server that reports no costs: each request (or kind) runs alone first, then together.

Together, a request's TTFT and its largest gap must stay within SOLO_MULTIPLE x its solo
figure + SOLO_SLACK_MS, the figure being the worst of SOLO_RUNS runs alone (a server that
sometimes holds a reply back and sends it in a lump, as vLLM on a busy CPU does, shows it
in one of them). `coopsched run --target` and the locust file (scenarios/concurrency2.py)
share this rule and these figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.live import client, stalls
from harness.run import metrics

SOLO_MULTIPLE = 3.0
SOLO_SLACK_MS = 25.0
SOLO_RUNS = 3
RULE = f"TTFT and largest gap <= {SOLO_MULTIPLE:g} x the worst of {SOLO_RUNS} solo runs + {SOLO_SLACK_MS:g} ms"


def solo_limit(ms: float) -> float:
    return SOLO_MULTIPLE * ms + SOLO_SLACK_MS


@dataclass(frozen=True)
class SoloFigures:
    """One request alone: TTFT and largest token gap (ms), tokens, and whether it finished."""
    ttft_ms: float | None
    stall_ms: float | None
    num_tokens: int
    error: str | None = None
    max_tokens_per_event: int = 1   # R of the stall rule (harness/live/stalls.py): one round's tokens
    pace_ms: float | None = None    # median interval between its arrivals (the stall rule's pace)

    def to_json(self) -> dict:
        return {"ttft_ms": self.ttft_ms, "stall_ms": self.stall_ms, "num_tokens": self.num_tokens,
                "error": self.error, "max_tokens_per_event": self.max_tokens_per_event, "pace_ms": self.pace_ms}


def figures(got: client.Collected) -> SoloFigures:
    times = got.token_times_ms(got.sent_ns)
    stall = max(metrics.itl(times), default=0.0) if times else None
    pace = stalls.pace_ms([stalls.Stream.of("solo", "solo", got)])
    return SoloFigures(times[0] if times else None, stall, len(times), got.error, max(got.counts, default=1), pace)


def measure(base: str, body: dict, *, path: str = "/v1/completions", timeout_s: float = 300.0,
            runs: int = SOLO_RUNS) -> SoloFigures:
    """Stream one request alone `runs` times; its figures are the worst of them."""
    alone = [figures(client.collect(base, body, path=path, timeout_s=timeout_s)) for _ in range(runs)]
    worst = lambda values: max((v for v in values if v is not None), default=None)
    paces = [f.pace_ms for f in alone if f.pace_ms]
    return SoloFigures(worst(f.ttft_ms for f in alone), worst(f.stall_ms for f in alone),
                       min(f.num_tokens for f in alone), next((f.error for f in alone if f.error), None),
                       max(f.max_tokens_per_event for f in alone), min(paces, default=None))
