"""Cost mode: the cost estimator, the arbiter's choices, the ms budget, parity, no starvation."""

import itertools
from collections import Counter

import pytest
from factories import make_backend, make_engine, make_requests, serve_both_ways, token_times

from coopsched.core import Request
from coopsched.core.modes.cost import CostEstimator
from mocks import CostModel

COST = CostModel()  # decode(1) 5 ms; round(K) = 2(K-1) + verify(K): K=2 10, K=3 15, K=4 20 ms
SLICE0 = COST.slice0(32)
FLOOR = COST.decode(1) + COST.round(2)  # 15 ms: the smallest gap that can hold any speculation
MEMORY_BOUND = CostModel(draft_per_token_ms=1.0, verify_ms=[[1, 20.0], [64, 30.0]])  # width is cheap


@pytest.mark.parametrize("points, size, expected", [
    pytest.param({}, (4,), None, id="nothing-measured"),
    pytest.param({(4,): 20.0}, (4,), 20.0, id="measured-exactly"),
    pytest.param({(4,): 20.0}, (2,), 20.0, id="smaller-is-bounded-by-larger"),
    pytest.param({(2,): 10.0}, (4,), 20.0, id="larger-scales-proportionally"),
    pytest.param({(2,): 10.0, (4,): 18.0}, (3,), 15.0, id="tightest-of-several"),
    pytest.param({(2, 1): 10.0}, (4, 2), 40.0, id="two-sizes-scale-together"),
    pytest.param({(4, 4): 53.0}, (4, 3), 53.0, id="fewer-rows-bounded"),
])
def test_cost_estimator(points, size, expected):
    est = CostEstimator()
    for key, ms in points.items():
        est.observe(key, ms)
    assert est.estimate(size) == (None if expected is None else pytest.approx(expected))


def test_estimator_keeps_the_worst_measurement():
    est = CostEstimator()
    for ms in (9.0, 12.0, 10.0):
        est.observe((2,), ms)
    assert est.estimate((2,)) == 12.0


def _run_cost(budget, classic_tokens=80, spec_tokens=60, **spec_kwargs):
    classic = Request("classic", tuple(range(65, 81)), classic_tokens, speculative=False)
    spec = Request("spec", tuple(range(70, 102)), spec_tokens, arrival_ms=20.0, **spec_kwargs)
    sched = make_engine(make_backend(cost=COST), mode="cost", hol_budget_ms=budget)
    result = sched.run([classic, spec])
    times = token_times(result)
    return sched, result, [b - a for a, b in zip(times["classic"], times["classic"][1:])], times


@pytest.mark.parametrize("budget", [15.0, 20.0, 30.0, 50.0, 80.0, 200.0])
def test_every_classic_gap_fits_the_budget(budget):
    _, result, gaps, _ = _run_cost(budget)
    admission = COST.decode(1) + SLICE0  # slice 0 alone may exceed a tight budget (checked by the harness)
    assert max(gaps) <= max(budget, admission) + 1e-9
    assert any(t.action == "spec_round" for t in result.ticks)


def test_more_budget_means_more_rounds_between_decodes_and_earlier_spec_finish():
    finish, per_gap = [], []
    for budget in (15.0, 30.0, 50.0, 80.0):
        _sched, result, _, times = _run_cost(budget)
        finish.append(times["spec"][-1])
        kinds = [t.action for t in result.ticks if t.action in ("decode", "spec_round")]
        runs = "".join("s" if k == "spec_round" else "d" for k in kinds).split("d")
        per_gap.append(max(len(r) for r in runs))
    assert finish == sorted(finish, reverse=True) and finish[0] > finish[-1]
    assert per_gap == sorted(per_gap) and per_gap[0] == 1 and per_gap[-1] >= 3


@pytest.mark.parametrize("accept_prob, settled", [(0.0, 2), (1.0, 4)], ids=["never-accepts", "always-accepts"])
def test_the_arbiter_picks_k_from_measured_costs_and_acceptance(accept_prob, settled):
    classic = Request("classic", tuple(range(65, 81)), 200, speculative=False)
    spec = Request("spec", tuple(range(70, 102)), 120, arrival_ms=20.0)
    sched = make_engine(make_backend(cost=MEMORY_BOUND, accept_prob=accept_prob), mode="cost",
                           hol_budget_ms=80.0)
    sched.run([classic, spec])
    ks = sched.scheduler.policy.k_log
    assert set(ks) == {2, 3, 4}  # every width gets measured once it fits
    # a forward costs about the same at any width here: a drafter that always misses makes the
    # narrowest round the cheapest token, one that never misses makes the widest one the cheapest
    assert Counter(ks[6:]).most_common(1)[0][0] == settled


def test_speculation_alone_runs_back_to_back_at_its_most_efficient_width():
    sched = make_engine(make_backend(cost=COST), mode="cost", hol_budget_ms=15.0)
    result = sched.run(make_requests(1, prompt_len=12, max_tokens=90))
    rounds = [t for t in result.ticks if t.action == "spec_round"]
    assert all(a.end_ms == b.start_ms for a, b in itertools.pairwise(rounds))  # no budget when no one waits
    arbiter = sched.scheduler.policy
    assert sorted(arbiter.k_log[:3]) == [2, 3, 4]
    best = max(range(2, 5), key=lambda k: arbiter.expected_tokens(k) / COST.round(k))
    assert Counter(arbiter.k_log).most_common(1)[0][0] == best == 2  # at 0.7 acceptance, K = 2 wins


def test_a_budget_below_the_floor_alternates_at_the_smallest_k_instead_of_starving():
    sched, _result, gaps, times = _run_cost(5.0, classic_tokens=200, spec_tokens=40)
    assert times["spec"] and sched.scheduler.requests == {}  # the speculative request finished beside the classic one
    assert set(sched.scheduler.policy.k_log) == {2}
    spec_gaps = [g for g in gaps if g > COST.decode(1) + 1e-9]
    assert max(spec_gaps[1:]) == pytest.approx(FLOOR)  # after admission: one decode + one K=2 round


@pytest.mark.parametrize("budget", [12.0, 50.0, 400.0])
@pytest.mark.parametrize("batched", [False, True], ids=["b1", "window"])
def test_cost_mode_parity_with_speculation_off(budget, batched):
    spec, classic, sched, _ = serve_both_ways(lambda: make_engine(
        make_backend(cost=COST, accept_prob=0.6), mode="cost", hol_budget_ms=budget, enable_batch=batched))
    assert sched.obs.rounds > 0
    assert spec == classic
