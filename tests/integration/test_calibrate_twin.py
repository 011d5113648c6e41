"""Calibration from engine ticks, and the twin report, in virtual time on the mock: a known profile is
recovered term by term, and a profile calibrated from one backend predicts its own workload runs."""

import itertools

import pytest

from coopsched.clock import ManualClock
from coopsched.core import MODES
from harness.calibrate import twin
from harness.calibrate.ticks import TickCalibration, draft_from_fused
from harness.run.scenario import RequestSpec, Scenario
from mocks import CostModel, MockBackend, MockDrafter

K = 4
TRUE = CostModel(prefill_fixed_ms=1.5, prefill_per_token_ms=0.1, draft_prefill_per_token_ms=0.04,
                 decode_ms=[[1, 3.0], [8, 6.5]], draft_per_token_ms=1.2, verify_ms=[[1, 3.0], [32, 12.0]],
                 switch_ms=0.4)


def calibrated(cost: CostModel, padding: str, passes: int = 2, accept_prob: float = 0.6) -> dict:
    seeds = itertools.count(1000)  # every run its own jitter draws, as a real machine's noise

    def backend(clock):
        seed = next(seeds)
        return MockBackend(clock, CostModel(**{**cost.to_json(), "seed": seed}), drafter=MockDrafter(accept_prob, seed))
    cal = TickCalibration(backend, K, clock_factory=ManualClock)
    for _ in range(passes):
        cal.run_pass()
    return cal.profile(fused_padding=padding)


@pytest.mark.parametrize("padding", ["ragged", "padded", "split"])
def test_every_term_is_recovered_from_the_ticks(padding):
    cost = CostModel(**{**TRUE.to_json(), "fused_padding": padding})
    profile = calibrated(cost, padding)
    near = lambda x: pytest.approx(x, abs=1e-3)  # the profile keeps 4 decimals
    assert profile["prefill_fixed_ms"] == near(1.5) and profile["prefill_per_token_ms"] == near(0.1)
    assert profile["draft_prefill_per_token_ms"] == near(0.04)
    assert profile["decode_ms"] == [[b, near(cost.decode(b))] for b in (1, 2, 4, 8)]
    assert profile["round_ms"] == [[k, near(cost.round(k))] for k in (2, 3, 4)]
    assert profile["switch_ms"] == near(0.4)
    if padding != "split":  # a split step is decode + round: the draft inside the round is not needed
        assert profile["draft_per_token_ms"] == near(1.2)
    twin_cost = CostModel(**{k: v for k, v in profile.items() if k != "fit"})
    for c in (1, 2):
        assert twin_cost.fused_step(c, K) == pytest.approx(cost.fused_step(c, K), abs=1e-2)
    assert twin_cost.round(K) == near(cost.round(K))


def test_the_acceptance_is_the_drafters():
    assert calibrated(TRUE, "ragged", passes=6, accept_prob=0.6)["accept_prob"] == pytest.approx(0.6, abs=0.06)


def test_no_switch_is_kept_below_the_noise():
    jittery = CostModel(**{**TRUE.to_json(), "switch_ms": 0.0, "jitter": 0.3})
    assert calibrated(jittery, "ragged")["switch_ms"] == 0.0


def test_draft_from_fused_inverts_the_fused_step():
    cost = CostModel(fused_padding="padded")
    steps = {c: cost.fused_step(c, K) for c in (1, 2, 4)}
    assert draft_from_fused(steps, cost.decode_ms, K, "padded") == pytest.approx(cost.draft_per_token_ms)


def test_the_twin_of_a_jittery_backend_predicts_its_runs_in_every_mode():
    """Calibrated from its ticks with fitted jitter, the profile predicts the fixed workload on the
    backend itself (other seeds): what `calibrate --report` shows on a real one, here exactly known."""
    real = CostModel(**{**TRUE.to_json(), "switch_ms": 0.0, "jitter": 0.25, "fused_padding": "split",
                        "accept_prob": 0.6})  # simulate() gives its drafter the profile's acceptance
    profile = calibrated(real, "split", passes=4, accept_prob=0.6)
    cost = CostModel(**{k: v for k, v in profile.items() if k != "fit"})
    assert set(cost.jitter_quantiles) >= {"decode", "verify", "prefill", "fused"}
    measured = {m: twin.simulate(real, twin.twin_config(m), range(100, 106)) for m in MODES}
    predicted = {m: twin.simulate(cost, twin.twin_config(m), range(6)) for m in MODES}
    report = twin.build_report(measured, predicted, 6)
    for mode, rows in report["modes"].items():
        for metric in ("aggregate_tok_s", "spec_tok_s", "classic_itl_p50_ms", "classic_itl_mean_ms"):
            assert abs(rows[metric]["error"]) < 0.1, (mode, metric, rows[metric])
        assert abs(rows["classic_itl_p99_ms"]["error"]) < 0.3, (mode, rows["classic_itl_p99_ms"])
        # 5 requests x 6 runs of TTFT; in cost mode the arbiter's learned bounds move the second
        # speculative request's admission (measured here: +29% mean, +50% p95)
        assert abs(rows["ttft_mean_ms"]["error"]) < 0.4, (mode, rows["ttft_mean_ms"])
    assert set(report["ratio_to_burst"]) == set(MODES)


def test_pooled_figures_and_errors():
    run = [twin.served(0.0, [10.0, 12.0, 14.0, 20.0], False), twin.served(5.0, [15.0, 15.0, 25.0], True)]
    figures = twin.pooled([run, run])
    assert figures["classic_itl_p50_ms"] == 2.0 and figures["classic_itl_mean_ms"] == pytest.approx(10 / 3)
    assert figures["spec_itl_mean_ms"] == 5.0 and figures["ttft_mean_ms"] == 10.0
    assert figures["aggregate_tok_s"] == pytest.approx(1000 * 7 / 25)
    row = twin.compare({"aggregate_tok_s": 110.0}, {"aggregate_tok_s": 100.0})["aggregate_tok_s"]
    assert row == {"predicted": 110.0, "measured": 100.0, "error": pytest.approx(0.1)}
    assert twin.compare({}, {"spec_tok_s": 3.0})["spec_tok_s"]["error"] is None


def test_a_workload_can_be_any_scenario():
    requests = (RequestSpec("c", max_tokens=8, speculative=False), RequestSpec("s", max_tokens=8))
    scen = Scenario("tiny", requests=requests)
    (run,) = twin.simulate(TRUE, twin.twin_config("fused"), [0], scenario=scen)
    assert [r["num_tokens"] for r in run] == [8, 8]


@pytest.mark.parametrize("argv, says", [
    pytest.param([], "give --out PROFILE.json", id="nothing-to-write"),
    pytest.param(["--out", "p.json", "--profile", "q.json", "--report", "r.json"], "give --out", id="both"),
    pytest.param(["--profile", "q.json"], "with --report", id="profile-without-report"),
    pytest.param(["--out", "p.json", "--block-size", "1"], "--block-size 1 (want >= 2)", id="k-below-2"),
    pytest.param(["--out", "p.json", "--heldout-requests", "1"], "--heldout-requests 1 (want >= 2)",
                 id="heldout-below-2"),
    pytest.param(["--out", "p.json", "--capacity-rungs", "-1"], "--capacity-rungs -1 (want >= 0)",
                 id="negative-capacity-rungs"),
    pytest.param(["--out", "p.json", "--server", "vllm"], "--server vllm names the kind of a --target server",
                 id="server-without-target"),
    pytest.param(["--out", "p.json", "--target", "http://127.0.0.1:9", "--model", "m"], "--model", id="target-and-mlx"),
    pytest.param(["--out", "p.json", "--model", "m"], "together", id="model-without-drafter"),
    pytest.param(["--out", "p.json", "--target", "http://127.0.0.1:9"], "answers neither", id="nothing-listening"),
])
def test_calibrate_refuses_what_it_cannot_do(argv, says, capsys, tmp_path, monkeypatch):
    from coopsched.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", *argv]) == 2
    assert says in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "p.json").exists()


def test_the_shipped_twin_profile_passes_every_scenario_in_every_mode():
    """scenarios/profiles/mlx-cpu-s-twin.json (calibrate on MLX, with fitted spreads and a split fused
    layout): every bound holds, priced by the fitted terms (the jitter's largest factor widens them)."""
    from harness.run import runner, scenario
    from harness.run.scenario import SCENARIO_DIR

    profile = CostModel.load(SCENARIO_DIR / "profiles" / "mlx-cpu-s-twin.json")
    assert profile.round_ms and profile.fused_padding == "split" and profile.jitter_quantiles and profile.accept_prob
    factory = lambda clock, scen, seed: runner.mock_backend(clock, scen, seed, profile)
    for name in scenario.available():
        for mode in MODES:
            trace = runner.run_scenario(scenario.load(name), mode, backend_factory=factory)
            assert all(c["ok"] for c in trace["checks"]), (name, mode, [c for c in trace["checks"] if not c["ok"]])
