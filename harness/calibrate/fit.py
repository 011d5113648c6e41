"""The estimators of black-box calibration, pure functions of token timings (ms).

Rounds from the grouping of token arrivals: the tokens of one speculative round
arrive together (one SSE event with several ids, or several events within a tiny
window), so the gaps between arrivals fall into two classes, inside a round and
between rounds, split on a log scale. The drafter's per-draft acceptance is the
one whose expected tokens per round equals the observed mean. Linear fits report
their residuals; a term's jitter is the quantiles of its samples over their mean.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_SEPARATION = 4.0     # a round's own arrivals are at least this much closer than the rounds are apart
DEFAULT_WINDOW_MS = 1.0  # when the gaps form one class: arrivals closer than this are one round
MAX_INSIDE_MS = 2.0      # arrivals of one round are never further apart than this
SIMULTANEOUS_MS = 0.02   # gaps are compared on a log scale shifted by this: below it, arrivals are simultaneous
NUM_QUANTILES = 101      # a term's jitter: its percentiles 0..100, so p50 and p99 carry over exactly


@dataclass(frozen=True)
class Group:
    """Arrivals taken as one round: when its first arrival came, and its tokens."""
    start_ms: float
    end_ms: float
    num_tokens: int


def split_threshold(gaps: Sequence[float]) -> float | None:
    """The gap that separates arrivals inside a round from arrivals of the next one: Otsu's cut on
    log gaps (the one that maximizes the variance between the two classes). None when there are
    not two such classes: MIN_SEPARATION x apart, the lower one under MAX_INSIDE_MS (a round's
    arrivals are written together; two speeds of whole rounds are not rounds and their insides)."""
    logs = np.sort(np.log(np.asarray(gaps, dtype=float) + SIMULTANEOUS_MS))
    n = logs.size
    if n < 2:
        return None
    sums = np.cumsum(logs)[:-1]                      # sum of logs[:i] for i = 1 .. n - 1
    counts = np.arange(1, n)
    low_mean, high_mean = sums / counts, (logs.sum() - sums) / (n - counts)
    cut = int(np.argmax(counts * (n - counts) * (high_mean - low_mean) ** 2)) + 1
    low, high = logs[:cut], logs[cut:]
    separated = np.exp(high.min() - low.max()) >= MIN_SEPARATION or \
        np.exp(high.mean() - low.mean()) >= MIN_SEPARATION ** 2
    if not separated or np.exp(low.max()) > MAX_INSIDE_MS:
        return None
    return float(np.exp((low.max() + high.min()) / 2))  # the geometric middle of the stretch between


def group_arrivals(times_ms: Sequence[float], counts: Sequence[int], window_ms: float | None = None) -> list[Group]:
    """Arrivals (time, tokens) grouped into rounds: an arrival closer than the window to the previous
    one joins its round. The window is given, or split from the gaps (`split_threshold`); when the
    gaps form one class, they are all rounds if their median exceeds DEFAULT_WINDOW_MS (every
    arrival a round of its own), else all inside one lump."""
    arrivals = [(t, n) for t, n in zip(times_ms, counts) if n > 0]
    if not arrivals:
        return []
    if window_ms is None:
        gaps = np.diff([t for t, _ in arrivals])
        window_ms = split_threshold(gaps) if gaps.size else None
        if window_ms is None:
            window_ms = 0.0 if gaps.size and np.median(gaps) > DEFAULT_WINDOW_MS else DEFAULT_WINDOW_MS
    groups = [[arrivals[0][0], arrivals[0][0], arrivals[0][1]]]
    for t, n in arrivals[1:]:
        if t - groups[-1][1] < window_ms:
            groups[-1][1], groups[-1][2] = t, groups[-1][2] + n
        else:
            groups.append([t, t, n])
    return [Group(a, b, n) for a, b, n in groups]


@dataclass(frozen=True)
class Rounds:
    """What a speculative stream's groups say: the gaps between rounds and the tokens of each."""
    gaps_ms: list[float]
    tokens: list[int]

    @property
    def mean_tokens(self) -> float | None:
        return float(np.mean(self.tokens)) if self.tokens else None


def rounds_of(groups: Sequence[Group]) -> Rounds:
    """The middle rounds: the first group is the first token (the prefill's), the last may be cut
    by the budget. A gap runs from one round's first arrival to the next one's."""
    middle = list(groups[1:-1])
    gaps = [b.start_ms - a.start_ms for a, b in itertools.pairwise(groups)][1:]  # from round 1 on
    return Rounds(gaps, [g.num_tokens for g in middle])


def expected_tokens_per_round(accept_prob: float, block_size: float) -> float:
    """The mock drafter's mean tokens a round of K emits: the accepted drafts (each with
    probability p, up to the first miss, at most K - 1) plus the target's own token. A fractional
    K is rounds of the whole sizes either side of it, mixed to its mean (proposals of varying length)."""
    whole = math.floor(block_size)
    tokens = 1.0 + sum(accept_prob ** i for i in range(1, whole))
    return tokens + (block_size - whole) * accept_prob ** whole


def acceptance_from_tokens(mean_tokens: float, block_size: float) -> float:
    """The per-draft acceptance whose expected tokens per round equals `mean_tokens` (bisection)."""
    target = min(max(mean_tokens, 1.0), float(block_size))
    low, high = 0.0, 1.0
    for _ in range(60):
        p = (low + high) / 2
        low, high = (p, high) if expected_tokens_per_round(p, block_size) < target else (low, p)
    return (low + high) / 2


@dataclass(frozen=True)
class LinearFit:
    """y = fixed + slope x by least squares, with its residuals (measured - fitted)."""
    fixed: float
    slope: float
    xs: list[float]
    ys: list[float]

    @classmethod
    def of(cls, xs: Sequence[float], ys: Sequence[float], relative: bool = False) -> LinearFit:
        """relative: least squares in relative error (each residual over its y), so a curve's short
        points are not given up to its long ones (one 700 ms point outweighs every 20 ms one)."""
        x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        if x.size >= 2 and np.ptp(x) > 0:
            weights = 1.0 / np.maximum(y, 1e-3) if relative else None
            slope, fixed = np.polyfit(x, y, 1, w=weights)
        else:
            slope, fixed = 0.0, float(y.mean())
        return cls(float(fixed), float(slope), [float(v) for v in x], [float(v) for v in y])

    def __call__(self, x: float) -> float:
        return self.fixed + self.slope * x

    @property
    def residuals(self) -> list[float]:
        return [y - self(x) for x, y in zip(self.xs, self.ys)]


def draft_share(prefill: LinearFit, points: Sequence[tuple[float, float]]) -> float:
    """The drafter's per-token share of slice 0 (prefill of both models): its (tokens, ms) points
    beyond the prefill line, fitted through the origin in relative error as the line is (weights
    1 / ms^2); 0 without points."""
    extra = [(x, y - prefill(x), 1.0 / max(y, 1e-3) ** 2) for x, y in points]
    return sum(w * x * d for x, d, w in extra) / sum(w * x * x for x, _, w in extra) if extra else 0.0


def jitter_quantiles(samples: Sequence[float], num: int = NUM_QUANTILES) -> list[float] | None:
    """The samples' quantiles at evenly spaced probabilities, over the mean of the distribution they
    describe (so a charge keeps its mean and takes the measured spread); None for < 2 samples."""
    from mocks.cost import quantile_mean

    data = np.asarray([s for s in samples if s > 0], dtype=float)
    if data.size < 2:
        return None
    qs = np.quantile(data, np.linspace(0.0, 1.0, num))
    return [round(float(q), 4) for q in qs / quantile_mean(list(qs))]


def levels(groups: dict, min_ratio_samples: int = 1) -> tuple[dict, list[float]]:
    """Each group's mean cost, estimated robustly, and every sample over its group's mean.

    A few foreign stalls would swing a small group's plain mean; the spread is the same process
    in every group, so each group's level is its median times the mean ratio sample / median
    pooled over all groups. Returns ({key: mean}, ratios to those means)."""
    medians = {key: float(np.median(xs)) for key, xs in groups.items() if len(xs) >= min_ratio_samples}
    ratios = [x / medians[key] for key, xs in groups.items() if key in medians for x in xs if medians[key] > 0]
    scale = float(np.mean(ratios)) if ratios else 1.0
    return {key: m * scale for key, m in medians.items()}, [r / scale for r in ratios]


def monotone(values: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """The non-decreasing sequence closest to `values` in weighted least squares (pool adjacent
    violators): more rows never cost less, and one noisy bump does not lift every larger size, as
    a running maximum would."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights or [1.0] * len(values)):
        blocks.append([float(v), float(w), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, w1, n1), (m2, w2, n2) = blocks[-2], blocks[-1]
            blocks[-2:] = [[(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2]]
    return [m for m, _, n in blocks for _ in range(n)]


def summary(samples: Sequence[float]) -> dict:
    """mean, p50, p99 of samples (None when empty)."""
    data = np.asarray(samples, dtype=float)
    if data.size == 0:
        return {"mean": None, "p50": None, "p99": None, "n": 0}
    return {"mean": float(data.mean()), "p50": float(np.percentile(data, 50)),
            "p99": float(np.percentile(data, 99)), "n": int(data.size)}


def profile_terms(prefill, draft_prefill: float, decode_points: list, draft_ms: float, k: int, round_ms: float,
                  round_points: list, fused_padding: str, switch: float, quantiles: dict, accept: float) -> dict:
    """A cost profile's terms from fitted figures, as every calibration writes them (the verify of
    K positions is what a round costs beyond its K - 1 drafts)."""
    return {
        "prefill_fixed_ms": round(max(prefill.fixed, 0.0), 4),
        "prefill_per_token_ms": round(max(prefill.slope, 0.0), 5),
        "draft_prefill_per_token_ms": round(max(draft_prefill, 0.0), 5),
        "decode_ms": decode_points,
        "draft_per_token_ms": round(draft_ms, 4),
        "verify_ms": [[1, decode_points[0][1]], [k, round(max(round_ms - draft_ms * (k - 1), 0.0), 4)]],
        "round_ms": round_points,
        "fused_padding": fused_padding,
        "switch_ms": round(switch, 4),
        "jitter_quantiles": {term: qs for term, qs in quantiles.items() if qs},
        "accept_prob": round(accept, 4),
    }
