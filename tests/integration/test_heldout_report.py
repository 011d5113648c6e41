"""The held-out check of `calibrate --report` in virtual time: a jittery mock stands in for the live
server (each "live" run its own jitter and acceptance draws), and the twin is its profile. The true
profile passes; one with its decode steps doubled fails the rule; the ladder stops at saturation; the
capacity (on the ladder's rates, and searched past them) tells the two apart; classic rows are what
each request asked."""

from dataclasses import replace

import pytest

from coopsched.core import SchedulerConfig
from harness.calibrate import books, heldout, twin
from harness.run import runner
from harness.run.slo import Slo
from harness.sweep.points import Timed
from mocks import CostModel

DOUBLED_DECODE = lambda cost: CostModel(**{**cost.to_json(), "decode_ms": [[b, 2 * ms] for b, ms in cost.decode_ms]})
TRUE = CostModel(prefill_fixed_ms=2.0, prefill_per_token_ms=0.2, decode_ms=[[1, 5.0], [8, 9.0]],
                 round_ms=[[4, 30.0]], accept_prob=0.6, jitter=0.2)
CONFIG = SchedulerConfig(mode="slice", block_size=4)
SOLO_MS = TRUE.prefill(108) + 48 * TRUE.decode(1)


def live(scen, run: int, _give_up=None) -> list[Timed]:
    """The 'server': the true costs, each run its own draws (as a real machine's noise)."""
    result = runner.execute(scen, CONFIG, heldout.SEED,
                            backend_factory=lambda c, s, _seed: runner.mock_backend(c, s, 100 + run, TRUE))
    return [Timed(r.id, r.arrival_ms, result.token_times[r.id], r.served_speculatively) for r in result.requests]


def predicted_by(profile: CostModel):
    return lambda scen, draw=0: twin.simulate_timed(profile, CONFIG, scen, heldout.SEED, draw=draw)


def test_the_true_profile_passes_every_row():
    report = heldout.check(live, predicted_by(TRUE), SOLO_MS, num_requests=24)
    assert report["pass"] is True, report
    for name, w in report["workloads"].items():
        assert set(w["rows"]) == set(heldout.METRICS)
        for metric, row in w["rows"].items():
            assert row["pass"] is True and len(row["runs"]) == heldout.LIVE_RUNS, (name, metric, row)
            assert row["spread"] > 0, (name, metric, row)  # the live runs differ: the spread is measured


def test_a_twin_with_doubled_decode_steps_fails():
    report = heldout.check(live, predicted_by(DOUBLED_DECODE(TRUE)), SOLO_MS, num_requests=24)
    assert report["pass"] is False
    failed = {(name, m) for name, w in report["workloads"].items() for m, r in w["rows"].items() if r["pass"] is False}
    assert ("light", "itl_mean_ms") in failed and ("knee", "itl_mean_ms") in failed, failed


def test_the_ladder_stops_at_the_first_rung_that_falls_behind():
    report = heldout.check(live, predicted_by(TRUE), SOLO_MS, num_requests=24)
    rungs = report["ladder"]
    assert [r["keeps_up"] for r in rungs[:-1]] == [True] * (len(rungs) - 1) and rungs[-1]["keeps_up"] is False
    assert report["knee_rate_per_s"] == rungs[-2]["rate_per_s"] > report["workloads"]["light"]["rate_per_s"]


def test_the_capacity_finds_the_true_twin_and_not_the_slow_one():
    """An SLO whose capacity on the ladder is a middle rung: the true twin's is the live one, the
    doubled decode's is lower; the search then bisects between that rung and the next, and the true
    twin stays near live; the cost-only twin beside it is reported and never judged."""
    on_ladder = heldout.check(live, predicted_by(TRUE), SOLO_MS, num_requests=24, capacity_rungs=0,
                              before=predicted_by(DOUBLED_DECODE(TRUE)), slo=Slo(ttft_ms=400))
    cap = on_ladder["capacity"]
    assert cap["rates"] == [r["rate_per_s"] for r in on_ladder["ladder"]] and len(cap["rates"]) >= 3, cap
    assert cap["twin"] == cap["live"] == cap["rates"][1] and cap["error"] == 0.0 and cap["search"] == [], cap
    assert cap["before"] < cap["live"] and cap["top_rate_is_a_bound"] is False, cap
    report = heldout.check(live, predicted_by(TRUE), SOLO_MS, num_requests=24,
                           before=predicted_by(DOUBLED_DECODE(TRUE)), slo=Slo(ttft_ms=400))
    searched = report["capacity"]
    assert cap["live"] <= searched["live"] < searched["missed"] <= cap["rates"][2], searched
    assert len(searched["search"]) >= 3 and abs(searched["error"]) <= 0.25, searched
    assert searched["before"] < min(searched["twin"], searched["live"]), searched
    assert report["pass"] is True  # the slow twin beside it does not fail the check ...
    befores = [r["before"]["error"] for w in report["workloads"].values() for r in w["rows"].values()]
    assert max(abs(e) for e in befores) > 0.25, befores  # ... though its rows are far off


def test_classic_rows_are_the_requests_that_asked_for_none():
    """A server that speculates every request (vLLM with ngram, llama.cpp with a draft model) still
    has classic rows: the requests that asked for no speculation, on both sides."""
    everything_speculated = lambda scen, run, _give_up=None: [replace(t, speculative=True) for t in live(scen, run)]
    report = heldout.check(everything_speculated, predicted_by(TRUE), SOLO_MS, num_requests=24)
    for w in report["workloads"].values():
        row = w["rows"]["classic_itl_p99_ms"]
        assert row["measured"] is not None and row["predicted"] is not None and row["pass"] is True, row
    scen = heldout.workload(2.0, 8)
    asked = heldout.by_ask(scen, everything_speculated(scen, 0))
    assert [t.speculative for t in asked] == [s.speculative for s in scen.specs(heldout.SEED)]
    assert {True, False} == {t.speculative for t in asked}


@pytest.mark.parametrize("predicted, runs, verdict", [
    pytest.param(105.0, [100.0, 100.0, 100.0], True, id="within-tolerance"),
    pytest.param(115.0, [100.0, 100.0, 100.0], False, id="beyond-tolerance"),
    pytest.param(115.0, [90.0, 100.0, 110.0], True, id="spread-widens-the-allowance"),
    pytest.param(140.0, [90.0, 100.0, 110.0], False, id="beyond-1.5x-spread"),
    pytest.param(None, [100.0, 100.0, 100.0], None, id="no-prediction-not-judged"),
    pytest.param(100.0, [100.0, None, 100.0], None, id="a-run-without-a-value-not-judged"),
])
def test_the_rule(predicted, runs, verdict):
    row = heldout.row("aggregate_tok_s", predicted, runs)  # tolerance 10%
    assert row["pass"] is verdict, row
    if verdict is not None:
        assert row["allowed"] == pytest.approx(max(0.10, 1.5 * (max(runs) - min(runs)) / 100.0))


def test_step_books_tell_a_twin_that_drafts_every_request_from_one_that_drafts_half():
    """The books hook: each workload keeps the live runs' mean books and each twin's. The 'server'
    speculates every request (as llama-server with a draft model); the twin that does too drafts as
    often, the one that speculates only the requests that asked drafts about half as often."""
    kept: dict = {}
    everything = lambda scen: replace(scen, workload=replace(scen.workload, speculative_share=1.0))

    def live_all(scen, run: int, _give_up=None) -> list[Timed]:
        result = runner.execute(everything(scen), CONFIG, heldout.SEED,
                                backend_factory=lambda c, s, _seed: runner.mock_backend(c, s, 100 + run, TRUE))
        kept["live"] = books.twin_books(result)
        return [Timed(r.id, r.arrival_ms, result.token_times[r.id], r.served_speculatively) for r in result.requests]

    def on(side, speculate_all: bool):
        keep = lambda run: kept.__setitem__(side, books.twin_books(run))
        return lambda scen, draw=0: twin.simulate_timed(TRUE, CONFIG, everything(scen) if speculate_all else scen,
                                                        heldout.SEED, on_run=keep, draw=draw)

    report = heldout.check(live_all, on("twin", True), SOLO_MS, num_requests=24, before=on("before", False),
                           books=lambda side: kept.pop(side, None))
    for name, w in report["workloads"].items():
        served, same, half = (w["books"][side] for side in ("live", "twin", "before"))
        assert served["drafts"] > 0 and abs(same["drafts"] / served["drafts"] - 1) <= 0.15, (name, w["books"])
        assert half["drafts"] < 0.75 * served["drafts"], (name, w["books"])
    assert "books" not in heldout.check(live, predicted_by(TRUE), SOLO_MS, num_requests=24)["workloads"]["light"]


# -- a server whose step grows with its rows' caches (llama-server's attention on one core) -----------
CACHE_BOUND = CostModel(**{**TRUE.to_json(), "context_per_token_ms": 0.02})
# what a fit by width alone makes of it: the probes' steps at their own ~39 cached tokens a row
WIDTH_ONLY = CostModel(**{**TRUE.to_json(), "decode_ms": [[b, ms + 0.02 * 39 * b] for b, ms in TRUE.decode_ms]})


def live_on(cost: CostModel):
    def run(scen, index: int, _give_up=None) -> list[Timed]:
        result = runner.execute(scen, CONFIG, heldout.SEED,
                                backend_factory=lambda c, s, _seed: runner.mock_backend(c, s, 100 + index, cost))
        return [Timed(r.id, r.arrival_ms, result.token_times[r.id], r.served_speculatively) for r in result.requests]
    return run


def test_a_cache_bound_server_is_predicted_with_the_context_term_and_not_by_width_alone():
    solo = heldout.solo_life_ms(CACHE_BOUND)
    right = heldout.check(live_on(CACHE_BOUND), predicted_by(CACHE_BOUND), solo, num_requests=24)
    wrong = heldout.check(live_on(CACHE_BOUND), predicted_by(WIDTH_ONLY), solo, num_requests=24)
    itl = lambda report: {name: w["rows"]["itl_mean_ms"] for name, w in report["workloads"].items()}
    assert all(row["pass"] for row in itl(right).values()), itl(right)
    assert all(not row["pass"] and row["error"] < -0.10 for row in itl(wrong).values()), itl(wrong)


def test_the_light_rate_counts_the_cache_a_solo_request_reads():
    # 48 decode steps over caches of 108, 109, ..., 155 tokens
    assert heldout.solo_life_ms(CACHE_BOUND) == pytest.approx(SOLO_MS + 0.02 * sum(range(108, 156)))
