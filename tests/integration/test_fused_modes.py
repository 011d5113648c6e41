"""Fused and cost modes on the scenarios, in virtual time: fused and cost bounds, parity, throughput vs the burst,
and proof that each new check fails on what it guards against."""

import json

import pytest

from coopsched.cli import main as cli
from coopsched.core import MODES
from harness.run import bounds, runner, scenario, trace_json
from harness.run.bounds import terms_of
from harness.run.scenario import SCENARIO_DIR
from harness.run.summary import summary_row
from harness.verdict import virtual
from mocks import CostModel, MockBackend

HOL_SCENARIOS = ("concurrency2", "many-classic")


def checks_of(trace) -> dict:
    return {c["name"]: c for c in trace["checks"]}


def classic_gaps(run) -> list[float]:
    return [b - a for r in run.requests if not r.served_speculatively
            for a, b in zip(run.token_times[r.id], run.token_times[r.id][1:])]


def spec_gaps(run) -> list[float]:
    """Classic gaps that hold speculative work (the HOL symptom), not classic admissions alone."""
    ends = [t.end_ms for t in run.ticks if t.action in ("spec_round", "fused") or t.kind.detail in ("slice0", "window")]
    return [b - a for r in run.requests if not r.served_speculatively
            for a, b in zip(run.token_times[r.id], run.token_times[r.id][1:]) if any(a < e <= b for e in ends)]


def test_both_modes_are_in_every_mode_list():
    assert {"fused", "cost"} <= set(MODES)


@pytest.mark.parametrize("name", HOL_SCENARIOS)
def test_fused_stall_is_one_fused_step_beyond_admission(name):
    scen = scenario.load(name)
    run = runner.execute(scen, runner.scenario_config(scen, "fused"))
    step = bounds.fused_step_ms(run)
    cost = runner.scenario_cost(scen, 0)
    spec_prompt = next(len(r.prompt_token_ids) for r in run.requests if r.served_speculatively)
    admission = cost.slice0(spec_prompt) + step  # slice 0 is a prefill: it runs alone, once
    num_classic = sum(not r.served_speculatively for r in run.requests)
    gaps = spec_gaps(run)
    assert max(gaps) == pytest.approx(admission)
    assert sum(g == pytest.approx(admission) for g in gaps) == num_classic  # once per classic row
    assert all(g == pytest.approx(step) for g in gaps if g != pytest.approx(admission))
    assert step < cost.decode(8 if name == "many-classic" else 1) + cost.round(4)  # below slice's bound


@pytest.mark.parametrize("budget", [20.0, 30.0, 50.0, 120.0])
@pytest.mark.parametrize("name", HOL_SCENARIOS)
def test_cost_stall_is_within_the_budget(name, budget):
    scen = scenario.load(name)
    trace = runner.run_scenario(scen, "cost", options={"hol_budget_ms": budget})
    assert all(c["ok"] for c in trace["checks"]), trace["checks"]
    cost = runner.scenario_cost(scen, 0)
    num_classic = sum(not r.speculative for r in scen.requests)
    spec_prompt = next(r.prompt_len for r in scen.requests if r.speculative)
    admission = cost.decode(num_classic) + cost.slice0(spec_prompt)  # the one gap a prefill may stretch
    assert summary_row(trace)["classic_stall_spec_ms"] <= max(budget, admission) + 1e-9
    if budget >= admission:
        assert summary_row(trace)["classic_stall_spec_ms"] <= budget + 1e-9


@pytest.mark.parametrize("mode", ["fused", "cost"])
@pytest.mark.parametrize("name", ["parity-b1", "parity-batched", *HOL_SCENARIOS])
def test_parity_is_unchanged(name, mode):
    trace = runner.run_scenario(scenario.load(name), mode)
    assert checks_of(trace)["parity"]["ok"] and checks_of(trace)["parity"]["value"] == 0
    if name == "parity-batched":
        assert checks_of(trace)["window"]["ok"]


@pytest.mark.parametrize("name", scenario.available())
def test_fused_throughput_is_at_least_095_of_the_burst_and_every_ratio_is_recorded(name):
    scen = scenario.load(name)
    ratios = {mode: runner.run_scenario(scen, mode)["ratio_to_burst"] for mode in MODES}
    assert ratios["burst"] == 1.0 and all(r is not None for r in ratios.values())
    assert ratios["fused"] >= 0.95
    assert checks_of(runner.run_scenario(scen, "fused"))["throughput_vs_burst"]["value"] == ratios["fused"]


# -- every new check fails on what it guards against ----------------------------------------------

def _as_mode(run, mode, **overrides):
    """The same run judged as if it were `mode` (a regression that ran the wrong schedule)."""
    run.config = run.config.with_(mode=mode, **overrides)
    return run


@pytest.mark.parametrize("impostor", ["burst", "slice"])
@pytest.mark.parametrize("name", HOL_SCENARIOS)
def test_fused_bound_fails_on_a_burst_or_an_alternating_run(name, impostor):
    scen = scenario.load(name)
    run = _as_mode(runner.execute(scen, runner.scenario_config(scen, impostor)), "fused")
    verdict = bounds.fused_gap_check(run, terms_of(run))
    assert verdict.holds is False and verdict.value > verdict.bound


def test_fused_bound_fails_when_the_forward_is_not_fused(monkeypatch):
    def two_forwards(self, decode_rows, verify_rows):  # decode and verify as separate model calls
        return self.decode(decode_rows), self.verify(verify_rows)
    monkeypatch.setattr(MockBackend, "fused", two_forwards)
    checks = checks_of(runner.run_scenario(scenario.load("concurrency2"), "fused"))
    assert not checks["classic_itl"]["ok"] and checks["parity"]["ok"]


@pytest.mark.parametrize("impostor", ["burst", "slice"])
@pytest.mark.parametrize("name", HOL_SCENARIOS)
def test_budget_bound_fails_on_a_burst_or_on_slices_under_a_tight_budget(name, impostor):
    scen = scenario.load(name)
    run = _as_mode(runner.execute(scen, runner.scenario_config(scen, impostor)), "cost", hol_budget_ms=20.0)
    verdict = bounds.budget_gap_check(run, terms_of(run))
    assert verdict.holds is False  # slice: decode + one K = 4 round is 25 ms or more > 20 ms


def test_budget_bound_fails_when_the_arbiter_ignores_the_budget(monkeypatch):
    from coopsched.core.modes.cost import CostPolicy

    def greedy(self, sched, running, is_fresh):
        self.k = self.max_k
        return True  # every speculative action "fits"
    monkeypatch.setattr(CostPolicy, "_fit", greedy)
    checks = checks_of(runner.run_scenario(scenario.load("concurrency2"), "cost"))
    assert not checks["classic_itl"]["ok"] and checks["classic_itl"]["value"] > 50.0


def test_throughput_check_fails_when_fusing_costs_throughput(monkeypatch):
    scen = scenario.load("concurrency2")
    burst = runner.execute(scen, runner.scenario_config(scen, "burst"))
    slow = runner.execute(scen, runner.scenario_config(scen, "burst"), backend_factory=_slower(1.1))
    verdict = virtual.throughput_vs_burst(virtual.Context.of(_as_mode(slow, "fused"), burst=burst))
    assert verdict.holds is False and verdict.value == pytest.approx(1 / 1.1, rel=1e-3)

    # a combined forward that costs more than its parts (every position priced at decode(B) x width)
    def padded(self, decode_rows, verify_rows):
        width = len(decode_rows) + sum(len(d) + 1 for _, _, d in verify_rows)
        self._charge(self.cost.decode(1) * width * 2)
        return self._decode_rows(decode_rows), self._verify_rows(verify_rows)
    monkeypatch.setattr(MockBackend, "fused", padded)
    checks = checks_of(runner.run_scenario(scen, "fused"))
    assert not checks["throughput_vs_burst"]["ok"] and checks["throughput_vs_burst"]["value"] < 0.95


def _slower(factor):
    def factory(clock, scen, seed):
        backend = runner.mock_backend(clock, scen, seed)
        c = backend.cost
        backend.cost = CostModel(**{**c.to_json(), "prefill_fixed_ms": c.prefill_fixed_ms * factor,
                                    "prefill_per_token_ms": c.prefill_per_token_ms * factor,
                                    "draft_prefill_per_token_ms": c.draft_prefill_per_token_ms * factor,
                                    "draft_per_token_ms": c.draft_per_token_ms * factor,
                                    "decode_ms": [[b, ms * factor] for b, ms in c.decode_ms],
                                    "verify_ms": [[w, ms * factor] for w, ms in c.verify_ms]})
        return backend
    return factory


def test_cli_all_modes_print_the_side_by_side_table(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert cli(["run", "concurrency2", "--mode", "all", "--json", str(out)]) == 0
    traces = json.loads(out.read_text())
    assert [t["mode"] for t in traces] == list(MODES)
    printed = capsys.readouterr().out
    assert "modes side by side" in printed and "x burst" in printed
    fused = next(t for t in traces if t["mode"] == "fused")
    assert f"{fused['ratio_to_burst']:.3f}" in printed


def test_fused_and_cost_traces_are_byte_reproducible():
    scen = scenario.load("rotation")
    for mode in ("fused", "cost"):
        assert trace_json.dumps([runner.run_scenario(scen, mode, seed=2)]) == \
            trace_json.dumps([runner.run_scenario(scen, mode, seed=2)])


# `coopsched calibrate` on this kind of CPU (tiny MLX model): a forward costs about the same
# whether it decodes or verifies, and width is cheap. Shipped for `coopsched run --cost`.
CALIBRATED = CostModel.load(SCENARIO_DIR / "profiles" / "mlx-cpu-s.json")


def _calibrated(clock, scen, seed):
    backend = runner.mock_backend(clock, scen, seed)
    backend.cost = runner.scenario_cost(scen, seed, CALIBRATED)
    return backend


@pytest.mark.parametrize("budget", [8.0, 50.0])
@pytest.mark.parametrize("mode", ["fused", "cost"])
@pytest.mark.parametrize("name", scenario.available())
def test_mode_bounds_hold_on_a_calibrated_profile(name, mode, budget):
    trace = runner.run_scenario(scenario.load(name), mode, backend_factory=_calibrated,
                                options={"hol_budget_ms": budget})
    assert all(c["ok"] for c in trace["checks"]), [c for c in trace["checks"] if not c["ok"]]
    if mode == "fused":
        assert trace["ratio_to_burst"] >= 0.95


@pytest.mark.parametrize("mode", ["fused", "cost"])
def test_a_granted_waiters_slice0_is_labelled_an_admission(mode):
    trace = runner.run_scenario(scenario.load("rotation"), mode, backend_factory=_calibrated,
                                options={"hol_budget_ms": 8.0})
    begins = [t for t in trace["ticks"] if t["action"] == "spec_round" and t["detail"] == "slice0"]
    assert [t["request_ids"] for t in begins] == [["spec-b"]]  # the waiter's prefill, in its grant tick


def test_throughput_is_gated_in_virtual_time_only():
    scen = scenario.load("concurrency2")
    burst = runner.execute(scen, runner.scenario_config(scen, "burst"))
    slow = _as_mode(runner.execute(scen, runner.scenario_config(scen, "burst"), backend_factory=_slower(1.5)),
                    "fused")
    slow.clock_kind = "real"
    verdict = virtual.throughput_vs_burst(virtual.Context.of(slow, burst=burst))
    assert verdict.skipped and verdict.ok is None and "0.667" in verdict.note
    assert slow.extra["ratio_to_burst"] == pytest.approx(1 / 1.5, rel=1e-3)
