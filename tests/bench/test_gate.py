"""The regression gate: it fails, naming the metric, on a worsened run and passes an unchanged one."""

from __future__ import annotations

import copy

import pytest

from coopsched.core import MODES
from harness.report import gate
from harness.run import runner, scenario

pytestmark = pytest.mark.bench


@pytest.fixture(scope="module")
def current():
    """Tracked metrics of this tree: every scenario x mode, seed 0 (what the baseline holds)."""
    return gate.metrics_of(runner.run_scenario(scenario.load(n), m, 0)
                           for n in scenario.available() for m in MODES)


def worsen(metric: str, value: float, factor: float) -> float:
    """Move `value` in the metric's bad direction by `factor` (relative)."""
    up = not gate.BY_NAME[metric].higher_is_better
    return value * (1 + factor) if up else value * (1 - factor)


def test_unchanged_run_passes_the_committed_baseline(current):
    baseline = gate.load_baseline()
    assert baseline, "reports/baseline/ is empty: run `coopsched report --update-baseline` and commit it"
    findings = gate.compare(current, baseline)
    assert not gate.failures(findings), gate.explain(findings)


def test_same_metrics_pass_and_the_explanation_says_so(current):
    findings = gate.compare(current, copy.deepcopy(current))
    assert {f.verdict for f in findings} == {"same"}
    assert "within 1%" in gate.explain(findings)


@pytest.mark.parametrize("metric", [m.name for m in gate.TRACKED])
def test_a_metric_worse_by_more_than_one_percent_fails_by_name(current, metric):
    scen, mode = next((s, m) for s, modes in sorted(current.items()) for m, v in sorted(modes.items())
                      if v[metric])
    worse = copy.deepcopy(current)
    worse[scen][mode][metric] = worsen(metric, current[scen][mode][metric], 0.02)
    failed = gate.failures(gate.compare(worse, current))
    assert [f.key for f in failed] == [f"{scen}/{mode}/{metric}"]
    assert f"{scen}/{mode}/{metric}" in gate.explain(failed)


@pytest.mark.parametrize(("factor", "verdict"), [(0.009, "same"), (0.011, "worse"), (-0.05, "better")],
                         ids=["within-1pct", "just-past-1pct", "improved"])
def test_the_tolerance_is_one_percent_in_the_bad_direction(factor, verdict):
    for metric in gate.TRACKED:
        assert gate.judge(metric.name, 100.0, worsen(metric.name, 100.0, factor)) == verdict, metric.name


def test_the_legacy_burst_fed_as_slice_fails_naming_the_stall(current):
    """A real regression: slice mode reverting to run-to-completion."""
    regressed = copy.deepcopy(current)
    regressed["concurrency2"]["slice"] = current["concurrency2"]["burst"]
    keys = {f.key for f in gate.failures(gate.compare(regressed, current))}
    assert {"concurrency2/slice/classic_itl_max_ms", "concurrency2/slice/burst_wall_ms",
            "concurrency2/slice/spec_ttft_p95_ms"} <= keys


def test_a_vanished_run_fails_and_a_new_one_is_not_gated(current):
    fewer = copy.deepcopy(current)
    del fewer["rotation"]
    assert {f.verdict for f in gate.compare(fewer, current) if f.key.startswith("rotation/")} == {"missing"}
    assert gate.failures(gate.compare(fewer, current))
    more = copy.deepcopy(current)
    more["concurrency2"]["future-mode"] = current["concurrency2"]["slice"]
    assert not gate.failures(gate.compare(more, current))


def test_update_baseline_round_trips(tmp_path, current):
    gate.write_baseline(current, tmp_path, commit="abc", seed=0)
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [f"{n}.json" for n in sorted(current)]
    assert gate.load_baseline(tmp_path) == current
    assert gate.baseline_info(tmp_path) == {"commit": "abc", "seed": 0}
