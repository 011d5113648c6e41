"""The per-token SLO, parsed once and judged per request (`coopsched judge`; `coopsched sweep` shares it).

A request meets the SLO iff its TTFT <= ttft_ms and EVERY inter-token gap <= itl_ms:
never a per-request mean, so one stall is a miss. A request that failed or streamed no
token misses it too; the attainment counts every request. Gaps are per token (0 inside a
multi-token arrival, harness/run/metrics.py), so a 0 never hides a stall.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from harness.run import metrics

SLO_KEYS = ("itl_ms", "ttft_ms")
DEFAULT_SLO = "itl_ms=100,ttft_ms=1000"
DEFAULT_ATTAINMENT = 0.9
GAP_QUANTILES = (50, 90, 99)
_DECIMAL = re.compile(r"^\+?(\d+(\.\d*)?|\.\d+)$")


class SloError(ValueError):
    """A --slo or --attainment value that cannot be used; the message says what is accepted."""


@dataclass(frozen=True, slots=True)
class Slo:
    itl_ms: float | None = None
    ttft_ms: float | None = None

    def describe(self) -> str:
        parts = [f"every gap <= {self.itl_ms:g} ms" if self.itl_ms is not None else None,
                 f"TTFT <= {self.ttft_ms:g} ms" if self.ttft_ms is not None else None]
        return " and ".join(p for p in parts if p)

    def to_json(self) -> dict:
        return {"itl_ms": self.itl_ms, "ttft_ms": self.ttft_ms}


def parse_slo(text: str) -> Slo:
    """'itl_ms=X,ttft_ms=Y' (either key alone is enough; ms, decimal, > 0)."""
    want = "want KEY=MS[,KEY=MS] with KEY in " + ", ".join(SLO_KEYS) + ", e.g. itl_ms=50,ttft_ms=500"
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or not all(items):
        raise SloError(f"--slo {text!r} has an empty item; {want}")
    values: dict[str, float] = {}
    for item in items:
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep:
            raise SloError(f"--slo item {item!r} has no '='; {want}")
        if key not in SLO_KEYS:
            raise SloError(f"--slo key {key!r} is unknown; accepted: {', '.join(SLO_KEYS)}")
        if key in values:
            raise SloError(f"--slo names {key} twice")
        if not _DECIMAL.match(raw) or float(raw) <= 0:
            raise SloError(f"--slo {key}={raw!r}: want a decimal number of ms > 0 (e.g. {key}=50)")
        values[key] = float(raw)
    return Slo(**values)


def parse_attainment(text: str) -> float:
    """A fraction in [0, 1] (0.9 = 90% of the requests must meet the SLO)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise SloError(f"--attainment {text!r}: want a fraction between 0 and 1 (e.g. 0.9)")
    return value


@dataclass(frozen=True, slots=True)
class RequestTiming:
    """One request as a load tool saw it: TTFT and every token gap (ms); error if it failed."""
    id: str
    ttft_ms: float | None
    gaps_ms: tuple[float, ...] = ()
    error: str | None = None
    group: str | None = None  # e.g. the run or the kind, for a per-group attainment


def miss_reason(slo: Slo, r: RequestTiming) -> str | None:
    """Why r misses the SLO (None: it meets it). The first gap over the limit is named by the
    token it follows, counted from 1."""
    if r.error:
        return f"failed: {r.error}"
    if r.ttft_ms is None:
        return "no token"
    if slo.ttft_ms is not None and r.ttft_ms > slo.ttft_ms:
        return f"TTFT {r.ttft_ms:.1f} > {slo.ttft_ms:g} ms"
    if slo.itl_ms is not None:
        for i, gap in enumerate(r.gaps_ms):
            if gap > slo.itl_ms:
                return f"gap {gap:.1f} > {slo.itl_ms:g} ms after token {i + 1} of {len(r.gaps_ms) + 1}"
    return None


def violations(slo: Slo, r: RequestTiming) -> tuple[str, ...]:
    """Every way r misses the SLO, () when it meets it: "failed" (an error or no token), or
    "ttft" and/or "itl" (a request can miss on both; `coopsched sweep` counts each cause)."""
    if r.error or r.ttft_ms is None:
        return ("failed",)
    ttft = slo.ttft_ms is not None and r.ttft_ms > slo.ttft_ms
    itl = slo.itl_ms is not None and any(gap > slo.itl_ms for gap in r.gaps_ms)
    return ("ttft",) * ttft + ("itl",) * itl


def meets(slo: Slo, r: RequestTiming) -> bool:
    return not violations(slo, r)


def attainment(slo: Slo, requests: Sequence[RequestTiming]) -> float | None:
    """The share of requests that meet the SLO (None with no request)."""
    return sum(meets(slo, r) for r in requests) / len(requests) if requests else None


def evaluate(slo: Slo, requests: Sequence[RequestTiming], *, num_worst: int = 5) -> dict:
    """Attainment, the misses, gap and TTFT percentiles, and the worst gaps with their request ids."""
    misses = [{"request": r.id, "reason": reason} for r in requests if (reason := miss_reason(slo, r))]
    gaps = [(g, r.id, i + 1) for r in requests for i, g in enumerate(r.gaps_ms)]
    values = [g for g, _, _ in gaps]
    worst = sorted(gaps, key=lambda x: -x[0])[:num_worst]
    return {
        "slo": slo.to_json(),
        "requests": len(requests),
        "met": len(requests) - len(misses),
        "slo_attainment": attainment(slo, requests),
        "failed_requests": sum(bool(r.error) for r in requests),
        "ttft_ms": metrics.percentiles([r.ttft_ms for r in requests if r.ttft_ms is not None], GAP_QUANTILES),
        "gap_ms": metrics.percentiles(values, GAP_QUANTILES),
        "arrival_gap_ms": metrics.percentiles([g for g in values if g > 0], GAP_QUANTILES),
        "gap_samples": len(values),
        "worst_gaps": [{"request": rid, "gap_ms": g, "after_token": i} for g, rid, i in worst],
        "misses": misses,
    }
