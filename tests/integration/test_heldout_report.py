"""The held-out check of `calibrate --report` in virtual time: a jittery mock stands in for the live
server (each "live" run its own jitter and acceptance draws), and the twin is its profile. The true
profile passes; one with its decode steps doubled fails the rule; the ladder stops at saturation."""

import pytest

from coopsched.core import SchedulerConfig
from harness.calibrate import heldout, twin
from harness.run import runner
from harness.sweep.points import Timed
from mocks import CostModel

TRUE = CostModel(prefill_fixed_ms=2.0, prefill_per_token_ms=0.2, decode_ms=[[1, 5.0], [8, 9.0]],
                 round_ms=[[4, 30.0]], accept_prob=0.6, jitter=0.2)
CONFIG = SchedulerConfig(mode="slice", block_size=4)
SOLO_MS = TRUE.prefill(108) + 48 * TRUE.decode(1)


def live(scen, run: int) -> list[Timed]:
    """The 'server': the true costs, each run its own draws (as a real machine's noise)."""
    result = runner.execute(scen, CONFIG, heldout.SEED,
                            backend_factory=lambda c, s, _seed: runner.mock_backend(c, s, 100 + run, TRUE))
    return [Timed(r.id, r.arrival_ms, result.token_times[r.id], r.served_speculatively) for r in result.requests]


def predicted_by(profile: CostModel):
    return lambda scen: twin.simulate_timed(profile, CONFIG, scen, heldout.SEED)


def test_the_true_profile_passes_every_row():
    report = heldout.check(live, predicted_by(TRUE), SOLO_MS, num_requests=24)
    assert report["pass"] is True, report
    for name, w in report["workloads"].items():
        assert set(w["rows"]) == set(heldout.METRICS)
        for metric, row in w["rows"].items():
            assert row["pass"] is True and len(row["runs"]) == heldout.LIVE_RUNS, (name, metric, row)
            assert row["spread"] > 0, (name, metric, row)  # the live runs differ: the spread is measured


def test_a_twin_with_doubled_decode_steps_fails():
    doubled = CostModel(**{**TRUE.to_json(), "decode_ms": [[b, 2 * ms] for b, ms in TRUE.decode_ms]})
    report = heldout.check(live, predicted_by(doubled), SOLO_MS, num_requests=24)
    assert report["pass"] is False
    failed = {(name, m) for name, w in report["workloads"].items() for m, r in w["rows"].items() if r["pass"] is False}
    assert ("light", "itl_mean_ms") in failed and ("knee", "itl_mean_ms") in failed, failed


def test_the_ladder_stops_at_the_first_rung_that_falls_behind():
    report = heldout.check(live, predicted_by(TRUE), SOLO_MS, num_requests=24)
    rungs = report["ladder"]
    assert [r["keeps_up"] for r in rungs[:-1]] == [True] * (len(rungs) - 1) and rungs[-1]["keeps_up"] is False
    assert report["knee_rate_per_s"] == rungs[-2]["rate_per_s"] > report["workloads"]["light"]["rate_per_s"]


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
