"""A real-clock `--mode all` table takes every "x burst" ratio against the burst run it prints, not
against the reference burst run the checks made for themselves (another run, other timings)."""

import itertools
import json

import pytest

from coopsched.clock import ManualClock
from harness.run import cli as run_cli
from harness.run import runner, scenario
from harness.run.summary import ratios_against_printed_burst, summary_row
from mocks import CostModel


class DriftingClock(ManualClock):
    """A 'real' clock whose runs each go slower than the last, as wall time drifts on a busy CPU."""
    kind = "real"
    runs = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.speed = 1.0 + 0.25 * next(self.runs)

    def sleep(self, ms: float) -> None:
        super().sleep(ms * self.speed)


def _traces(name: str = "concurrency2") -> list[dict]:
    scen = scenario.load(name)
    return [runner.run_scenario(scen, mode, clock_factory=DriftingClock) for mode in ("burst", "slice", "fused")]


def _agg(trace: dict) -> float:
    return trace["throughput"]["aggregate_tok_s"]


def test_without_the_fix_the_ratio_uses_another_burst_run():
    burst, _, fused = _traces()
    assert fused["ratio_to_burst"] != pytest.approx(_agg(fused) / _agg(burst), rel=1e-3)


def test_every_ratio_is_taken_against_the_printed_burst():
    traces = _traces()
    ratios_against_printed_burst(traces)
    burst = traces[0]
    for trace in traces:
        assert summary_row(trace)["ratio_to_burst"] == pytest.approx(_agg(trace) / _agg(burst), abs=1e-6)
    note = next(c["note"] for c in traces[2]["checks"] if c["name"] == "throughput_vs_burst")
    assert f"{traces[2]['ratio_to_burst']:.3f}" in note and "printed beside it" in note


def test_virtual_time_and_unpaired_traces_are_left_alone():
    scen = scenario.load("concurrency2")
    virtual = [runner.run_scenario(scen, mode) for mode in ("burst", "fused")]
    before = json.dumps(virtual)
    ratios_against_printed_burst(virtual)
    assert json.dumps(virtual) == before
    lone = [runner.run_scenario(scen, "fused", clock_factory=DriftingClock)]  # no burst printed beside it
    before = json.dumps(lone)
    ratios_against_printed_burst(lone)
    assert json.dumps(lone) == before


def test_the_cli_prints_ratios_against_its_own_burst_row(monkeypatch, tmp_path, capsys):
    fast = CostModel.simple(decode_ms=0.5, round_ms=3.0)
    monkeypatch.setattr(run_cli, "RealClock", DriftingClock)
    monkeypatch.setattr(run_cli, "backend_factory",
                        lambda args: lambda clock, scen, seed: runner.mock_backend(clock, scen, seed, fast))
    out = tmp_path / "t.json"
    run_cli.main(run_cli.argparse.Namespace(names=["concurrency2"], mode="all", json=out, seed=0,
                                             backend="mlx", model=None, draft_model=None, cost=None,
                                             target=None, hol_budget_ms=None))
    traces = json.loads(out.read_text())
    burst = next(t for t in traces if t["mode"] == "burst")
    printed = capsys.readouterr().out
    for trace in traces:
        assert trace["clock"] == "real"
        assert trace["ratio_to_burst"] == pytest.approx(_agg(trace) / _agg(burst), abs=1e-6)
        assert f"{trace['ratio_to_burst']:.3f}" in printed
