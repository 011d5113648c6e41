"""The context term both step fitters share: a row's mean cached tokens over its steps, and the
slope of a step's price per cached token and position between a short and a long prompt."""

from __future__ import annotations


def mean_cached(prompt_n: float, predicted_n: int) -> float:
    """The tokens a row holds in its cache over its steps after the first token, on average (the
    prompt, then one more each step): what the mock's context term counts for a decode row."""
    return prompt_n + max(predicted_n - 2, 0) / 2


def context_slope(short: tuple[float, float], long: tuple[float, float], positions: int) -> float:
    """ms per cached token per position, from a step (ms, mean cached tokens) at a short and at a
    long prompt, `positions` decode/verify positions a step: each position's attention reads its
    row's whole cache."""
    (short_ms, short_ctx), (long_ms, long_ctx) = short, long
    if long_ctx <= short_ctx:
        return 0.0
    return max((long_ms - short_ms) / (positions * (long_ctx - short_ctx)), 0.0)
