"""The [workload] generator: arrival statistics, length distributions, shares, ids, seeds.

Tolerances come from the sample size: with n gaps, a sample mean's relative standard
error is CV / sqrt(n) and a sample std's is about sqrt((kurtosis - 1) / (4 n)); each bound
below is about five standard errors, so a correct generator passes for any seed and a
wrong rate, shape or mean (off by 10% or more) fails.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from factories import make_engine, make_requests
from hypothesis import given
from hypothesis import strategies as st

from coopsched.core import Request, TickKind
from coopsched.engine import Arrivals
from harness.run.workload import Lengths, Workload, WorkloadError

N = 20_001  # 20 000 gaps


def workload(**table) -> Workload:
    return Workload.parse(table, Path("."))


def gaps(w: Workload, seed: int = 0) -> np.ndarray:
    return np.diff(w.arrivals_ms(seed))


@pytest.mark.parametrize(("arrival", "burstiness", "cv", "cv_tol", "mean_tol"), [
    # exponential gaps: kurtosis 9, so SE(std)/std = sqrt(8 / 4n) = 0.010 and SE(mean)/mean = 0.007
    ("poisson", None, 1.0, 0.05, 0.035),
    # gamma shape 0.25: CV 2, kurtosis 3 + 6/k = 27, SE(std)/std = sqrt(26 / 4n) = 0.018, SE(mean)/mean = 0.014
    ("gamma", 0.25, 2.0, 0.10, 0.07),
    # gamma shape 4: CV 0.5, kurtosis 4.5, SE(std)/std = 0.0066, SE(mean)/mean = 0.0035
    ("gamma", 4.0, 0.5, 0.035, 0.02),
], ids=["poisson", "gamma-bursty", "gamma-regular"])
@pytest.mark.parametrize("seed", [0, 7])
def test_open_loop_arrivals_have_the_asked_rate_and_cv(arrival, burstiness, cv, cv_tol, mean_tol, seed):
    table = {"num_requests": N, "arrival": arrival, "rate_per_s": 50}
    if burstiness is not None:
        table["burstiness"] = burstiness
    g = gaps(workload(**table), seed)
    assert g.mean() == pytest.approx(20.0, rel=mean_tol)  # 50 requests/s: 20 ms apart on average
    assert g.std() / g.mean() == pytest.approx(cv, rel=cv_tol)
    assert (g >= 0).all()


def test_constant_arrivals_are_evenly_spaced_from_start_ms():
    arrivals = workload(num_requests=1000, arrival="constant", rate_per_s=40, start_ms=100).arrivals_ms(3)
    assert arrivals[0] == 100.0
    assert np.diff(arrivals) == pytest.approx(np.full(999, 25.0), abs=1e-5)  # CV 0 (rounded to 1e-6 ms)


def test_a_misread_rate_or_shape_would_fail_these_tolerances():
    """The tolerances above are tight enough to catch a 10% error in rate or a Poisson passed off as gamma."""
    poisson = gaps(workload(num_requests=N, arrival="poisson", rate_per_s=55))
    assert poisson.mean() != pytest.approx(20.0, rel=0.035)
    bursty = gaps(workload(num_requests=N, arrival="gamma", rate_per_s=50, burstiness=1.0))
    assert bursty.std() / bursty.mean() != pytest.approx(2.0, rel=0.10)


def test_lognormal_lengths_have_the_asked_mean():
    # sigma 0.8: CV of the lengths sqrt(e^0.64 - 1) = 0.95, SE(mean)/mean = 0.95 / sqrt(N) = 0.0067
    lengths = Lengths.parse("max_tokens", {"mean": 64, "sigma": 0.8}).sample(np.random.default_rng(1), N)
    assert lengths.mean() == pytest.approx(64, rel=0.03)
    assert lengths.min() >= 1 and lengths.dtype.kind == "i"
    # and the underlying normal has the asked sigma: log-lengths' std (rounding blurs the smallest)
    assert np.log(lengths[lengths >= 8]).std() == pytest.approx(0.8, rel=0.1)


def test_uniform_lengths_respect_and_reach_both_bounds():
    lengths = Lengths.parse("prompt_len", {"min": 16, "max": 128}).sample(np.random.default_rng(2), N)
    assert lengths.min() == 16 and lengths.max() == 128
    assert lengths.mean() == pytest.approx(72, rel=0.01)  # uniform: SE(mean) = 32.3 / sqrt(N) = 0.23


@given(spec=st.one_of(
           st.integers(1, 5000),
           st.tuples(st.integers(1, 500), st.integers(0, 500)).map(lambda t: {"min": t[0], "max": t[0] + t[1]}),
           st.tuples(st.floats(0.01, 5000), st.floats(0, 3)).map(lambda t: {"mean": t[0], "sigma": t[1]})),
       seed=st.integers(0, 2 ** 32), n=st.integers(1, 200))
def test_any_valid_length_spec_yields_integers_at_least_one_within_its_bounds(spec, seed, n):
    lengths = Lengths.parse("prompt_len", spec).sample(np.random.default_rng(seed), n)
    assert len(lengths) == n and lengths.dtype.kind == "i" and (lengths >= 1).all()
    if isinstance(spec, int):
        assert (lengths == spec).all()
    elif "min" in spec:
        assert spec["min"] <= lengths.min() and lengths.max() <= spec["max"]


@pytest.mark.parametrize("share", [0.0, 0.3, 0.5, 1.0])
def test_speculative_share_is_exact(share):
    specs = workload(num_requests=1001, arrival="poisson", rate_per_s=10, speculative_share=share).specs(0)
    assert sum(s.speculative for s in specs) == round(share * 1001)


def test_ids_are_zero_padded_and_sort_in_arrival_order():
    specs = workload(num_requests=12_000, arrival="gamma", rate_per_s=100, burstiness=0.5).specs(4)
    assert specs[0].id == "w00000" and specs[-1].id == "w11999"
    assert [s.id for s in sorted(specs, key=lambda s: (s.arrival_ms, s.id))] == sorted(s.id for s in specs)
    assert workload(num_requests=3, arrival="constant", rate_per_s=1).ids() == ["w0000", "w0001", "w0002"]


def test_same_seed_same_requests_other_seed_differs():
    w = workload(num_requests=200, arrival="poisson", rate_per_s=20, prompt_len={"min": 4, "max": 64},
                 max_tokens={"mean": 30, "sigma": 0.5}, speculative_share=0.4)
    assert w.specs(5) == w.specs(5)
    assert w.specs(5) != w.specs(6)
    assert w.specs(-1) != w.specs(1)  # any int seed, negative too


def test_the_streams_are_independent_of_each_other():
    """Changing the length distribution leaves the arrivals alone (one salted stream per purpose)."""
    a = workload(num_requests=50, arrival="poisson", rate_per_s=20, prompt_len=8).specs(0)
    b = workload(num_requests=50, arrival="poisson", rate_per_s=20, prompt_len={"min": 1, "max": 9}).specs(0)
    assert [s.arrival_ms for s in a] == [s.arrival_ms for s in b]
    assert [s.speculative for s in a] == [s.speculative for s in b]


@pytest.mark.parametrize(("table", "fragment"), [
    ({"num_requests": 5, "arrival": "poisson"}, "rate_per_s is missing"),
    ({"num_requests": 5, "arrival": "poisson", "rate_per_s": True}, "rate_per_s = true"),
    ({"num_requests": 5, "arrival": "poisson", "rate_per_s": float("inf")}, "rate_per_s"),
    ({"num_requests": 2.0, "arrival": "poisson", "rate_per_s": 1}, "num_requests = 2.0"),
    ({"num_requests": 5, "arrival": "closed", "concurrency": 2.5}, "concurrency = 2.5"),
    ({"num_requests": 5, "arrival": "constant", "rate_per_s": 1, "start_ms": -1}, "start_ms = -1"),
], ids=["no-rate", "bool-rate", "infinite-rate", "float-count", "float-concurrency", "negative-start"])
def test_parse_errors_name_the_value(table, fragment):
    with pytest.raises(WorkloadError, match=fragment):
        workload(**table)


def test_generating_100k_specs_is_fast():
    """Vectorised draws: 100k request specs in well under two seconds (measured ~0.2 s)."""
    import time
    w = workload(num_requests=100_000, arrival="poisson", rate_per_s=100, prompt_len={"min": 16, "max": 128},
                 max_tokens={"mean": 64, "sigma": 0.8}, speculative_share=0.3)
    start = time.process_time()
    assert len(w.specs(0)) == 100_000
    assert time.process_time() - start < 5.0  # generous: a shared 2-core machine


# -- the engine's arrivals ---------------------------------------------------------------

def test_arrivals_pop_earliest_first_and_keep_ties_in_insertion_order():
    requests = make_requests(5)
    for r, t in zip(requests, [30.0, 10.0, 10.0, 0.0, 30.0]):
        r.arrival_ms = t
    arrivals = Arrivals(requests)
    order = [arrivals.pop().id for _ in range(len(arrivals))]
    assert order == ["r3", "r1", "r2", "r0", "r4"]  # what the stable sort gave


def test_a_list_and_an_arrivals_heap_run_identically():
    from factories import make_backend

    from coopsched.clock import ManualClock

    def run(wrap):
        clock = ManualClock()
        requests = make_requests(6, max_tokens=12)
        for i, r in enumerate(requests):
            r.arrival_ms = [0, 50, 5, 5, 200, 1][i]
        result = make_engine(make_backend(clock)).run(wrap(requests))
        return [(t.start_ms, t.end_ms, t.action, t.request_ids) for t in result.ticks]
    assert run(list) == run(Arrivals)


def test_arrivals_pushed_on_a_finish_are_submitted_at_that_instant():
    from factories import make_backend

    from coopsched.clock import ManualClock

    class Chain(Arrivals):
        """Each finish sends one more request, until three have run."""
        def __init__(self):
            super().__init__([Request("a0", (65, 66), 4, speculative=False)])
            self.sent = 1

        def on_finish(self, event):
            if self.sent < 3:
                self.push(Request(f"a{self.sent}", (65, 66), 4, speculative=False, arrival_ms=event.time_ms))
                self.sent += 1
    clock = ManualClock()
    chain = Chain()
    result = make_engine(make_backend(clock)).run(chain)
    finishes = {e.seq_id: e.time_ms for e in result.events if e.finish_reason is not None}
    admits = {t.request_ids[0]: t.start_ms for t in result.ticks if t.kind is TickKind.ADMIT}
    assert sorted(finishes) == ["a0", "a1", "a2"]
    assert admits["a1"] == finishes["a0"] and admits["a2"] == finishes["a1"]
    assert math.isclose(clock.now(), finishes["a2"])
