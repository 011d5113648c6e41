"""What a live run of a scenario recorded: each request's stream together (`Streamed`) and its
runs alone (`Solo`), times in ms from the run's start. `coopsched run --target` fills them
(harness/live/http_target.py); its checks (harness/verdict/target.py) read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.live import stalls
from harness.live.solo import median
from harness.run import metrics
from harness.run.scenario import RequestSpec


@dataclass
class Streamed:
    """What one request's stream delivered, times in ms from the run's start."""
    spec: RequestSpec
    sent_ms: float = 0.0
    token_ids: list[int] = field(default_factory=list)
    token_times_ms: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    server_id: str | None = None
    served_speculatively: bool | None = None
    burst: dict | None = None
    stream: stalls.Stream | None = None   # raw arrivals and tick ends, for the stall rule
    max_event_tokens: int = 1
    end_ms: float | None = None           # when the stream ended ([DONE], an error or a cut)
    timings: dict | None = None           # llama.cpp's per-request `timings` (draft_n: tokens drafted)

    @property
    def ttft_ms(self) -> float | None:
        return self.token_times_ms[0] - self.sent_ms if self.token_times_ms else None

    @property
    def stall_ms(self) -> float:
        return max(metrics.itl(self.token_times_ms), default=0.0)

    @property
    def is_speculative(self) -> bool:
        return self.spec.speculative if self.served_speculatively is None else self.served_speculatively

    @property
    def kind(self) -> str:
        return "spec" if self.is_speculative else "classic"

    @property
    def was_speculated_against_ask(self) -> bool:
        """Sent `speculative: false`, yet the server says (extension or `timings.draft_n`) it speculated."""
        return not self.spec.speculative and bool(self.served_speculatively)

    @property
    def life_ms(self) -> tuple[float, float] | None:
        """Sent -> last token, ms from the run's start."""
        return (self.sent_ms, self.token_times_ms[-1]) if self.token_times_ms else None


@dataclass
class Solo:
    """One request's runs alone: its largest gap is the median of them, its TTFT the worst (solo.py)."""
    runs: list[Streamed]

    @property
    def ttft_ms(self) -> float | None:
        """The worst: a TTFT's limit has no ceiling, and a tight one charged TTFTs that held the other
        stream at its pace (the gap figure is the median: a gap's limit is where a burst hides)."""
        return max((r.ttft_ms for r in self.runs if r.ttft_ms is not None), default=None)

    @property
    def stall_ms(self) -> float | None:
        return median(r.stall_ms for r in self.runs if r.token_times_ms)

    @property
    def token_ids(self) -> list[int]:
        return self.runs[0].token_ids

    @property
    def text(self) -> str:
        return self.runs[0].text

    @property
    def num_tokens(self) -> int:
        return min(len(r.token_times_ms) for r in self.runs)

    @property
    def max_event_tokens(self) -> int:
        return max(r.max_event_tokens for r in self.runs)

    @property
    def streams(self) -> list[stalls.Stream]:
        return [r.stream for r in self.runs if r.stream is not None]

    @property
    def life_ms(self) -> float | None:
        """The shortest run alone, sent to last token."""
        return min((r.token_times_ms[-1] - r.sent_ms for r in self.runs if r.token_times_ms), default=None)
