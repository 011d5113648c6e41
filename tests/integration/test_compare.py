"""`coopsched compare BASE NEW`: a run against itself passes, the same scenarios on a server twice
as slow (every cost term doubled) regress and the reverse does not, a slower server's sweep loses
capacity, a small-sample percentile is advisory, and files that cannot be compared exit 2."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from factories import cli_error_line, mixed_workload

from coopsched.cli import main as cli
from harness.compare import rule
from harness.report import gate
from mocks import CostModel

SCENARIOS = ("concurrency2", "many-classic")


def doubled_profile(path: Path) -> Path:
    """The default mock's cost profile with every term doubled: the same server, twice as slow."""
    profile = CostModel().to_json()
    for key in ("prefill_fixed_ms", "prefill_per_token_ms", "draft_prefill_per_token_ms", "draft_per_token_ms"):
        profile[key] *= 2
    for key in ("decode_ms", "verify_ms"):
        profile[key] = [[size, ms * 2] for size, ms in profile[key]]
    path.write_text(json.dumps(profile))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("compare")
    slow = doubled_profile(tmp / "slow.json")
    out = {"base": tmp / "base.json", "slow": tmp / "slow-run.json"}
    assert cli(["run", *SCENARIOS, "--mode", "all", "--json", str(out["base"])]) == 0
    assert cli(["run", *SCENARIOS, "--mode", "all", "--cost", str(slow), "--json", str(out["slow"])]) == 0
    return out


def compare(capsys, *argv) -> tuple[int, str]:
    code = cli(["compare", *map(str, argv)])
    return code, capsys.readouterr().out


def test_a_run_compared_with_itself_has_no_regression(runs, capsys, tmp_path):
    code, out = compare(capsys, runs["base"], runs["base"], "--json", tmp_path / "c.json")
    assert code == 0 and "no regression" in out
    body = json.loads((tmp_path / "c.json").read_text())
    assert body["regressions"] == [] and {r["verdict"] for r in body["rows"]} == {"same"}
    keys = {r["key"] for r in body["rows"]}
    assert keys == {f"{s}/{m}" for s in SCENARIOS for m in ("burst", "slice", "fused", "cost")}
    assert set(body["rows"][0]) >= {"key", "metric", "base", "new", "delta_pct", "regressed"}


def test_a_server_twice_as_slow_regresses_naming_classic_itl_p50(runs, capsys, tmp_path):
    code, out = compare(capsys, runs["base"], runs["slow"], "--json", tmp_path / "c.json")
    assert code == 1 and "classic_itl_p50_ms" in out.splitlines()[-1]
    body = json.loads((tmp_path / "c.json").read_text())
    p50 = {r["key"]: r for r in body["regressions"] if r["metric"] == "classic_itl_p50_ms"}
    assert set(p50) == {f"{s}/{m}" for s in SCENARIOS for m in ("burst", "slice", "fused", "cost")}
    assert p50["concurrency2/slice"]["delta_pct"] == 100.0  # every decode step takes twice as long
    assert all(r["regressed"] for r in body["regressions"])


def test_the_faster_direction_is_no_regression(runs, capsys):
    code, out = compare(capsys, runs["slow"], runs["base"])
    assert code == 0 and "no regression" in out


def test_a_threshold_above_the_slowdown_lets_it_pass(runs, capsys, tmp_path):
    """Doubled costs can move a metric by much more than 2x (queueing), so a high threshold is needed."""
    body_path = tmp_path / "c.json"
    compare(capsys, runs["base"], runs["slow"], "--json", body_path)
    worst = max(abs(r["delta_pct"]) for r in json.loads(body_path.read_text())["rows"] if r["delta_pct"] is not None)
    code, _ = compare(capsys, runs["base"], runs["slow"], "--threshold", f"{worst + 1:.0f}%")
    assert code == 0


def test_a_percentile_over_too_few_samples_is_advisory(runs, capsys, tmp_path):
    """concurrency2 has 2 requests: its TTFT percentiles double but stay advisory below --min-samples."""
    compare(capsys, runs["base"], runs["slow"], "--json", tmp_path / "c.json")
    rows = {(r["key"], r["metric"]): r for r in json.loads((tmp_path / "c.json").read_text())["rows"]}
    ttft = rows[("concurrency2/slice", "ttft_p95_ms")]
    assert ttft["verdict"] == "advisory" and not ttft["regressed"] and ttft["samples"] == 2
    compare(capsys, runs["base"], runs["slow"], "--min-samples", "0", "--json", tmp_path / "all.json")
    rows = {(r["key"], r["metric"]): r for r in json.loads((tmp_path / "all.json").read_text())["rows"]}
    assert rows[("concurrency2/slice", "ttft_p95_ms")]["regressed"]


def test_a_dropped_scenario_mode_is_a_regression(runs, capsys, tmp_path):
    fewer = [t for t in json.loads(runs["base"].read_text()) if t["mode"] != "cost"]
    (tmp_path / "fewer.json").write_text(json.dumps(fewer))
    code, out = compare(capsys, runs["base"], tmp_path / "fewer.json")
    assert code == 1 and "concurrency2/cost" in out and "(missing)" in out


def test_the_page_overlays_both_runs(runs, capsys, tmp_path):
    code, _ = compare(capsys, runs["base"], runs["slow"], "--out", tmp_path / "page")
    assert code == 1
    page = (tmp_path / "page" / "index.html").read_text()
    assert "itl_cdf.png" in page and "timeline.png" in page and "classic_itl_p50_ms" in page
    assert (tmp_path / "page" / "itl_cdf.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "page" / "compare.json").read_text())["regressions"]


def test_a_slower_servers_sweep_has_less_capacity(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mixed.toml").write_text(mixed_workload(40, accept_prob=0.6))
    slow = doubled_profile(tmp_path / "slow.json")
    sweep = ["sweep", "mixed.toml", "--rates", "2,4,6", "--mode", "slice", "--seeds", "1", "--slo", "itl_ms=250"]
    assert cli([*sweep, "--json", "base.json"]) == 0
    assert cli([*sweep, "--cost", str(slow), "--json", "slow.json"]) == 0
    capsys.readouterr()
    base_cap = json.loads((tmp_path / "base.json").read_text())["capacity"]["slice"]
    slow_cap = json.loads((tmp_path / "slow.json").read_text())["capacity"]["slice"]
    assert (slow_cap or 0) < base_cap
    code, out = compare(capsys, "base.json", "slow.json", "--json", "c.json", "--out", "page")
    assert code == 1
    regressions = json.loads((tmp_path / "c.json").read_text())["regressions"]
    assert {"key": "slice", "metric": "capacity"}.items() <= next(r for r in regressions
                                                                  if r["metric"] == "capacity").items()
    assert f"slice capacity {base_cap} -> {slow_cap or 0}" in out.splitlines()[-1]
    assert compare(capsys, "slow.json", "base.json")[0] == 0
    assert (tmp_path / "page" / "capacity.png").is_file()


def test_locust_reports_compare_on_their_per_request_timings(tmp_path, capsys):
    report = json.loads((Path(__file__).parents[1] / "fixtures" / "judge" / "locust_report.json").read_text())
    slow = copy.deepcopy(report)
    for r in slow["per_request"]:  # every gap and TTFT twice as long
        r["token_times_ms"] = [r["arrival_ms"] + 2 * (t - r["arrival_ms"]) for t in r["token_times_ms"]]
    (tmp_path / "a.json").write_text(json.dumps(report))
    (tmp_path / "b.json").write_text(json.dumps(slow))
    assert compare(capsys, tmp_path / "a.json", tmp_path / "a.json")[0] == 0
    code, out = compare(capsys, tmp_path / "a.json", tmp_path / "b.json", "--min-samples", "0")
    assert code == 1 and "classic_itl_p50_ms" in out


CANNOT = [  # id, base, new, extra args, fragments
    ("missing-file", "nowhere.json", "base", [], ["nowhere.json: no such file"]),
    ("not-json", "junk", "base", [], ["not a JSON file"]),
    ("unknown-shape", "other", "base", [], ["not a trace JSON", "a sweep JSON", "a locust report"]),
    ("run-vs-sweep", "base", "sweep", [], ["compare two runs", "or two sweeps"]),
    ("nothing-in-common", "base", "renamed", [], ["no scenario/mode in common"]),
    ("bad-threshold", "base", "base", ["--threshold", "five"], ["--threshold 'five'", "percentage >= 0"]),
    ("bad-min-samples", "base", "base", ["--min-samples", "-1"], ["--min-samples '-1'"]),
    ("bad-slo", "base", "base", ["--slo", "itl=3"], ["--slo key 'itl' is unknown"]),
]


@pytest.mark.parametrize(("base", "new", "extra", "fragments"), [c[1:] for c in CANNOT], ids=[c[0] for c in CANNOT])
def test_files_that_cannot_be_compared_exit_2_saying_why(runs, tmp_path, capsys, base, new, extra, fragments):
    traces = json.loads(runs["base"].read_text())
    files = {"base": runs["base"], "junk": tmp_path / "junk", "other": tmp_path / "other.json",
             "sweep": tmp_path / "sweep.json", "renamed": tmp_path / "renamed.json",
             "nowhere.json": tmp_path / "nowhere.json"}
    files["junk"].write_text("{oops")
    files["other"].write_text('{"hello": 1}')
    files["sweep"].write_text(json.dumps({"points": [], "capacity": {}, "summary": {}}))
    files["renamed"].write_text(json.dumps([{**t, "scenario": "other-" + t["scenario"]} for t in traces]))
    line = cli_error_line(capsys, ["compare", str(files[base]), str(files[new]), *extra])
    for fragment in fragments:
        assert fragment in line, line


def test_sweeps_under_different_slos_cannot_be_compared(tmp_path, capsys):
    sweep = {"load_kind": "rate", "slo": {"itl_ms": 250.0, "ttft_ms": None}, "attainment": 0.9, "points": [],
             "summary": {"slice": [{"load": 2}]}, "capacity": {"slice": 2}}
    (tmp_path / "a.json").write_text(json.dumps(sweep))
    (tmp_path / "b.json").write_text(json.dumps({**sweep, "slo": {"itl_ms": 100.0, "ttft_ms": None}}))
    line = cli_error_line(capsys, ["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert "the sweeps differ in slo" in line


# -- one rule: the bench gate and coopsched report judge with it ---------------------------------

@pytest.mark.parametrize(("higher", "base", "new", "verdict"), [
    (False, 100.0, 105.0, "same"), (False, 100.0, 105.1, "worse"), (False, 100.0, 90.0, "better"),
    (True, 100.0, 95.0, "same"), (True, 100.0, 94.9, "worse"), (True, 100.0, 120.0, "better"),
    (False, None, 3.0, "new"), (False, 3.0, None, "missing"), (False, None, None, "same"),
    (False, 0.0, 0.0, "same"), (False, 0.0, 0.5, "worse"),
])
def test_the_rule_judges_in_the_metrics_bad_direction(higher, base, new, verdict):
    assert rule.judge(higher, base, new, 0.05) == verdict


def test_the_gate_is_the_rule_at_one_percent():
    for metric in gate.TRACKED:
        for base, new in ((100.0, 101.5), (100.0, 98.5), (100.0, 100.5), (None, 1.0), (1.0, None)):
            assert gate.judge(metric.name, base, new) == rule.judge(metric.higher_is_better, base, new, 0.01)
    current = {"s": {"slice": {"classic_itl_p50_ms": 10.2, "aggregate_tok_s": 100.0}}}
    baseline = {"s": {"slice": {"classic_itl_p50_ms": 10.0, "aggregate_tok_s": 100.0}}}
    findings = {f.key: f.verdict for f in gate.compare(current, baseline)}
    assert findings["s/slice/classic_itl_p50_ms"] == "worse" and findings["s/slice/aggregate_tok_s"] == "same"


def test_ignore_mode_compares_one_mode_with_another(runs, capsys, tmp_path):
    traces = json.loads(runs["base"].read_text())
    for mode in ("burst", "slice"):
        (tmp_path / f"{mode}.json").write_text(json.dumps([t for t in traces if t["mode"] == mode]))
    code, _ = compare(capsys, tmp_path / "burst.json", tmp_path / "slice.json", "--ignore-mode", "--json",
                      tmp_path / "c.json")
    rows = {(r["key"], r["metric"]): r for r in json.loads((tmp_path / "c.json").read_text())["rows"]}
    assert rows[("concurrency2", "classic_itl_max_ms")]["verdict"] == "better"  # 795 -> 35 ms: the HOL block gone
    assert code == int(any(r["regressed"] for r in rows.values()))
    line = cli_error_line(capsys, ["compare", str(runs["base"]), str(tmp_path / "slice.json"), "--ignore-mode"])
    assert "--ignore-mode needs one mode per file" in line and "concurrency2/burst" in line
