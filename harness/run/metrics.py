"""Latency and throughput from raw per-token times (ms), with numpy.

Vocabulary as DESIGN.md section 7: TTFT, ITL (gaps between consecutive token
arrivals; one round's tokens arrive together), stall (largest ITL), TPOT.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from itertools import accumulate

import numpy as np


def request_metrics(arrival_ms: float, times_ms: Sequence[float]) -> dict:
    times = np.asarray(times_ms, dtype=float)
    if times.size == 0:
        return {"tokens": 0, "ttft_ms": None, "itl_p50_ms": None, "itl_p99_ms": None,
                "stall_ms": None, "tpot_ms": None}
    gaps = np.diff(times)
    return {
        "tokens": int(times.size),
        "ttft_ms": float(times[0] - arrival_ms),
        "itl_p50_ms": float(np.percentile(gaps, 50)) if gaps.size else None,
        "itl_p99_ms": float(np.percentile(gaps, 99)) if gaps.size else None,
        "stall_ms": float(gaps.max()) if gaps.size else 0.0,
        "tpot_ms": float((times[-1] - times[0]) / (times.size - 1)) if times.size > 1 else None,
    }


def percentiles(samples: Sequence[float], qs=(50, 99)) -> dict:
    data = np.asarray(samples, dtype=float)
    return {f"p{q}": (float(np.percentile(data, q)) if data.size else None) for q in qs} | {
        "max": float(data.max()) if data.size else None}


def weighted_percentiles(counts: Mapping[float, int], qs=(50, 99)) -> dict:
    """`percentiles` of a multiset given as value -> count, without expanding it.

    The same numbers, bit for bit, as numpy's default (linear) method on the expanded
    samples: the virtual index (n - 1) q, and numpy's two-sided interpolation.
    """
    values = sorted(v for v, c in counts.items() if c > 0)
    ends = list(accumulate(counts[v] for v in values))  # ends[k]: samples with value <= values[k]
    n = ends[-1] if ends else 0
    at = lambda i: values[bisect_right(ends, i)]
    out = {}
    for q in qs:
        if n == 0:
            out[f"p{q}"] = None
            continue
        index = (n - 1) * (q / 100)
        if index >= n - 1:
            out[f"p{q}"] = float(values[-1])
            continue
        below = math.floor(index)
        a, b, gamma = at(below), at(below + 1), index - below
        out[f"p{q}"] = float(b - (b - a) * (1 - gamma) if gamma >= 0.5 else a + (b - a) * gamma)
    return out | {"max": float(values[-1]) if values else None}


def throughput(requests: Sequence[dict]) -> dict:
    """Aggregate and speculative tokens per second over the span of the run."""
    with_tokens = [r for r in requests if r["token_times_ms"]]
    if not with_tokens:
        return {"aggregate_tok_s": 0.0, "spec_tok_s": None}
    start = min(r["arrival_ms"] for r in requests)
    end = max(r["token_times_ms"][-1] for r in with_tokens)
    total = sum(len(r["token_ids"]) for r in requests)
    spec = [r for r in with_tokens if r["speculative"]]
    spec_rate = None
    if spec:
        spec_span = max(r["token_times_ms"][-1] for r in spec) - min(r["arrival_ms"] for r in spec)
        spec_rate = 1000.0 * sum(len(r["token_ids"]) for r in spec) / spec_span if spec_span > 0 else None
    return {"aggregate_tok_s": 1000.0 * total / (end - start) if end > start else None,
            "spec_tok_s": spec_rate}


def gaps_of(times_ms: Sequence[float]) -> list[tuple[float, float]]:
    """(start, end) of every inter-token gap."""
    return [(a, b) for a, b in zip(times_ms, times_ms[1:])]
