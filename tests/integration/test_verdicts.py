"""`coopsched run` and `coopsched report` never call a skipped check a pass; --strict fails it."""

from __future__ import annotations

import json

import pytest

from coopsched.cli import main as cli
from harness.run import runner, scenario
from harness.verdict import virtual

NO_SPEC = "no request was served speculatively: MLXCEL_ENABLE_MTP_B1=0"


def run(capsys, *args: str) -> tuple[int, str]:
    code = cli(["run", *args])
    return code, " ".join(capsys.readouterr().out.split())  # rich wraps long lines


def test_gates_that_turn_speculation_off_say_so_and_strict_fails_them(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("MLXCEL_ENABLE_MTP_B1", "0")
    out = tmp_path / "t.json"
    code, text = run(capsys, "concurrency2", "rotation", "--mode", "slice", "--json", str(out))
    assert code == 0 and f"4 hold, 6 skipped ({NO_SPEC}) across 2 runs" in text
    assert "expectations hold" not in text
    checks = [c for t in json.loads(out.read_text()) for c in t["checks"]]
    skipped = [c for c in checks if c.get("skipped")]
    assert len(skipped) == 6 and all(c["ok"] is None and c["note"] == NO_SPEC for c in skipped)
    code, text = run(capsys, "concurrency2", "rotation", "--mode", "slice", "--strict")
    assert code == 1 and "--strict: 6 skipped check(s) fail the run" in text and "4 hold, 6 skipped" in text


def test_strict_passes_when_every_check_ran(capsys, tmp_path):
    out = tmp_path / "t.json"
    code, text = run(capsys, "concurrency2", "rotation", "--mode", "all", "--strict", "--json", str(out))
    checks = [c for t in json.loads(out.read_text()) for c in t["checks"]]
    assert code == 0 and f"all {len(checks)} expectations hold across 8 runs" in text
    assert all(c["ok"] is True and "skipped" not in c for c in checks)


def test_the_legacy_burst_fails_rotation_instead_of_skipping_it():
    trace = runner.run_scenario(scenario.load("rotation"), "burst")
    rotation = next(c for c in trace["checks"] if c["name"] == "rotation")
    assert rotation["holds"] is False and rotation["expect"] == "fail" and rotation["ok"] is True


def test_rotation_fails_a_sliced_run_without_grants():
    """The planted regression: no rotation (grant rounds 0) and the check catches it."""
    scen = scenario.load("rotation")
    run = runner.execute(scen, runner.scenario_config(scen, "slice", {"grant_rounds": 0}))
    (rotation,) = [c for c in virtual.evaluate(run) if c.name == "rotation"]
    assert rotation.holds is False and rotation.ok is False


def test_a_scenarios_own_gate_is_named_as_the_reason(monkeypatch):
    scen = scenario.load("concurrency2")
    scen = type(scen)(**{**scen.__dict__, "gates": {"MLXCEL_ENABLE_MTP_B1": "off"}})
    monkeypatch.delenv("MLXCEL_ENABLE_MTP_B1", raising=False)
    trace = runner.run_scenario(scen, "slice")
    notes = {c["note"] for c in trace["checks"] if c.get("skipped")}
    assert notes == {"no request was served speculatively: the scenario's gates: MLXCEL_ENABLE_MTP_B1=off"}


@pytest.mark.parametrize("skip", [False, True])
def test_the_report_counts_a_skip_as_neither_held_nor_ok(tmp_path, skip):
    from harness.report import gate
    from harness.report.build import Report, _checks_tables, _verdicts, render_markdown

    trace = runner.run_scenario(scenario.load("concurrency2"), "slice")
    if skip:
        trace["checks"][0] = virtual.Check.skip("classic_itl", NO_SPEC).to_json()
    report = Report(tmp_path, [trace], gate.metrics_of([trace]), [], [], {})
    ok, _title, text = next(v for v in _verdicts(report) if v[1] == "checks")
    n = len(trace["checks"])
    if skip:
        assert ok is None and text.startswith(f"{n - 1} hold, 1 skipped ({NO_SPEC})")
        assert f"{n - 1}/{n} ok, 1 skipped" in _checks_tables(report)
        assert f"| {n - 1}/{n} | - | classic_itl |" in render_markdown(report)
    else:
        assert ok is True and text == f"all {n} expectations hold across 1 run"


@pytest.mark.parametrize("mode", ["slice", "fused"])
def test_a_profile_that_prices_the_cache_is_bounded_at_the_longest_cache(mode):
    """A context term (a step's attention over its rows' caches) raises every step's price: the
    decode, round and fused terms the bounds are built from carry it at the longest cache a row can
    hold, so a gap that the term lengthens is still bounded; priced by width alone, it is not."""
    from dataclasses import replace

    from harness.run import bounds

    scen = scenario.load("many-classic")
    priced = replace(scen, cost={**scen.cost, "context_per_token_ms": 0.05})
    failed = lambda: [c["name"] for c in runner.run_scenario(priced, mode)["checks"] if c["ok"] is False]
    assert failed() == []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bounds, "longest_context", lambda run: 0)
        assert "classic_itl" in failed()
