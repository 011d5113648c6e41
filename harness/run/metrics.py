"""Latency and throughput from raw per-token times (ms), with numpy; token accounting of streamed arrivals.

Vocabulary as docs/architecture.md (metrics vocabulary): TTFT, ITL (gaps between consecutive token
arrivals; one round's tokens arrive together), stall (largest ITL), TPOT.
An arrival (one SSE event) of n tokens is n tokens at one time: n - 1 zero gaps
inside it, never invented spacing. Every client, the locust files and
`coopsched judge` count tokens and gaps with the functions at the end.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from itertools import accumulate, pairwise

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


# -- token accounting of streamed arrivals ---------------------------------------------
def token_counts(counts: Sequence[int | None], text_lengths: Sequence[int],
                 completion_tokens: int | None) -> list[int]:
    """Tokens per arrival. A known count (the event's token ids) is kept. Text-only arrivals
    (None) share what the final usage leaves, in proportion to their text, at least 1 each
    (largest remainder): without a tokenizer only the split varies, never a gap. With no
    usage, or a usage too small to give each one a token, each counts 1."""
    out = [0 if n is None else int(n) for n in counts]
    unknown = [i for i, n in enumerate(counts) if n is None]
    if not unknown:
        return out
    left = None if completion_tokens is None else int(completion_tokens) - sum(out)
    if left is None or left < len(unknown):
        for i in unknown:
            out[i] = 1
        return out
    extra = left - len(unknown)
    weights = np.asarray([max(int(text_lengths[i]), 0) for i in unknown], dtype=float)
    if weights.sum() == 0:
        weights[:] = 1.0
    share = extra * weights / weights.sum()
    whole = np.floor(share).astype(int)
    # hand the rest to the largest remainders, the earliest first among equals
    for j in sorted(range(len(unknown)), key=lambda j: (whole[j] - share[j], j))[:extra - int(whole.sum())]:
        whole[j] += 1
    for j, i in enumerate(unknown):
        out[i] = 1 + int(whole[j])
    return out


def token_times(times: Sequence[float], counts: Sequence[int]) -> list[float]:
    """One time per token: each of an arrival's n tokens became visible at the arrival."""
    return [t for t, n in zip(times, counts) for _ in range(n)]


def itl(token_times_ms: Sequence[float]) -> list[float]:
    """The ITL samples of per-token times: one per token after the first."""
    return np.diff(np.asarray(token_times_ms, dtype=float)).tolist()


def gap_spans(token_times_ms: Sequence[float]) -> list[tuple[float, float]]:
    """(start, end) of each inter-token gap, for asking what ran inside it."""
    return list(pairwise(token_times_ms))


def token_gaps(times: Sequence[float], counts: Sequence[int]) -> list[float]:
    """The ITL samples of arrivals: one per token after the first, 0 inside a multi-token arrival."""
    return itl(token_times(times, counts))


def arrival_gaps(times: Sequence[float], counts: Sequence[int]) -> list[float]:
    """Gaps between the arrivals that carried tokens (what a chunk-level tool records)."""
    return np.diff(np.asarray([t for t, n in zip(times, counts) if n > 0], dtype=float)).tolist()
