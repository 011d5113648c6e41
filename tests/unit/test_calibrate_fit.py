"""The estimators of black-box calibration on synthetic timings: rounds from the grouping of token
arrivals, the drafter's acceptance from tokens per round, linear fits and fitted jitter."""

import itertools
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.calibrate import fit
from mocks import CostModel, MockDrafter
from mocks.cost import quantile_mean


def synthetic_stream(sizes, round_ms, inside_ms, seed=0, one_event_per_round=False, sigma=0.2):
    """Arrival times and token counts of a stream whose rounds emit `sizes` tokens: a first token,
    then rounds `round_ms` apart (lognormal spread), each round's tokens `inside_ms` apart at most."""
    rng = random.Random(seed)
    times, counts, t = [0.0], [1], 0.0
    for size in sizes:
        t += round_ms * rng.lognormvariate(0.0, sigma)
        if one_event_per_round:
            times.append(t)
            counts.append(size)
            continue
        inside = t
        for _ in range(size):
            times.append(inside)
            counts.append(1)
            inside += rng.uniform(0.0, inside_ms)
    return times, counts


@given(sizes=st.lists(st.integers(1, 6), min_size=3, max_size=80),
       round_ms=st.floats(2.0, 200.0), inside_fraction=st.floats(0.0, 0.05),
       seed=st.integers(0, 10_000), per_event=st.booleans())
def test_groups_recover_every_round(sizes, round_ms, inside_fraction, seed, per_event):
    inside = min(inside_fraction * round_ms, 0.5)
    times, counts = synthetic_stream(sizes, round_ms, inside, seed, per_event)
    groups = fit.group_arrivals(times, counts)
    assert [g.num_tokens for g in groups] == [1, *sizes]
    rounds = fit.rounds_of(groups)
    assert rounds.tokens == sizes[:-1] and len(rounds.gaps_ms) == len(sizes) - 1


@given(gaps=st.lists(st.floats(2.0, 50.0), min_size=2, max_size=60))
def test_one_class_of_gaps_is_never_split(gaps):
    """Whole rounds at two speeds (a loaded machine) are not rounds and their insides."""
    assert fit.split_threshold(gaps) is None
    times = np.concatenate(([0.0], np.cumsum(gaps)))
    assert all(g.num_tokens == 1 for g in fit.group_arrivals(times, [1] * len(times)))


def test_a_given_window_wins():
    times, counts = [0.0, 5.0, 5.3, 10.0], [1, 1, 1, 1]
    assert [g.num_tokens for g in fit.group_arrivals(times, counts, window_ms=0.1)] == [1, 1, 1, 1]
    assert [g.num_tokens for g in fit.group_arrivals(times, counts, window_ms=6.0)] == [4]


def test_arrivals_without_tokens_are_skipped():
    assert [g.num_tokens for g in fit.group_arrivals([0.0, 1.0, 9.0], [1, 0, 2])] == [1, 2]
    assert fit.group_arrivals([], []) == []


@pytest.mark.parametrize("p", [0.0, 0.3, 0.6, 0.9, 1.0])
@pytest.mark.parametrize("k", [2, 4, 6])
def test_acceptance_inverts_the_expected_tokens(p, k):
    assert fit.acceptance_from_tokens(fit.expected_tokens_per_round(p, k), k) == pytest.approx(p, abs=1e-6)


@pytest.mark.parametrize("p", [0.2, 0.6, 0.85])
def test_acceptance_of_the_mock_drafter_is_recovered_from_timings(p):
    """The mock drafter's rounds, timed as a server streams them, give back its acceptance."""
    k, drafter = 4, MockDrafter(p, seed=3)
    sizes = [drafter.num_matching(f"r{r % 4}", r, k - 1) + 1 for r in range(400)]
    times, counts = synthetic_stream(sizes, 42.0, 0.3, seed=1)
    rounds = fit.rounds_of(fit.group_arrivals(times, counts))
    assert fit.acceptance_from_tokens(rounds.mean_tokens, k) == pytest.approx(p, abs=0.05)
    assert np.mean(rounds.gaps_ms) == pytest.approx(42.0 * np.exp(0.2 ** 2 / 2), rel=0.05)


def test_linear_fit_and_residuals():
    line = fit.LinearFit.of([8, 64, 256], [3.0, 14.0, 53.0])
    assert line.slope == pytest.approx(0.2, abs=0.01) and line.fixed == pytest.approx(1.5, abs=0.5)
    assert sum(line.residuals) == pytest.approx(0.0, abs=1e-9)
    assert fit.LinearFit.of([16, 16], [2.0, 4.0]).slope == 0.0  # one length: a flat fit


def test_fitted_jitter_keeps_the_mean_and_the_percentiles():
    rng = np.random.default_rng(0)
    samples = 7.0 * rng.lognormal(0.0, 0.3, 5000)
    qs = fit.jitter_quantiles(samples / samples.mean())
    assert len(qs) == fit.NUM_QUANTILES and quantile_mean(qs) == pytest.approx(1.0, abs=1e-3)
    cost = CostModel(decode_ms=[[1, float(samples.mean())]], jitter_quantiles={"decode": qs})
    draws = [cost.jittered(random.Random(i), cost.decode(1), "decode") for i in range(20_000)]
    for q in (50, 99):
        assert np.percentile(draws, q) == pytest.approx(np.percentile(samples, q), rel=0.03)
    assert np.mean(draws) == pytest.approx(samples.mean(), rel=0.01)
    assert fit.jitter_quantiles([3.0]) is None


def test_monotone_pools_a_bump_instead_of_lifting_every_larger_size():
    assert fit.monotone([7.3, 7.3, 8.0, 7.4, 7.4, 7.4]) == pytest.approx([7.3, 7.3, 7.55, 7.55, 7.55, 7.55])
    assert fit.monotone([1.0, 3.0, 2.0], [1, 1, 3]) == pytest.approx([1.0, 2.25, 2.25])
    assert fit.monotone([1.0, 2.0, 5.0]) == [1.0, 2.0, 5.0]


@given(values=st.lists(st.floats(0.0, 100.0), min_size=1, max_size=12),
       weights=st.lists(st.integers(1, 50), min_size=12, max_size=12))
def test_monotone_is_non_decreasing_and_keeps_the_weighted_mean(values, weights):
    weights = weights[:len(values)]
    out = fit.monotone(values, weights)
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(out))
    assert np.average(out, weights=weights) == pytest.approx(np.average(values, weights=weights), abs=1e-6)
