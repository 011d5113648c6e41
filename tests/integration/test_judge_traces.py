"""`coopsched judge` on `coopsched run concurrency2 --json` traces: slice meets the per-token SLO, burst misses it.

The ITL limit is computed from the traces (between slice's largest gap and burst's stall),
and the issue's itl_ms=200 separates them too.
"""

from __future__ import annotations

import json
from itertools import pairwise

import pytest

from coopsched.cli import main as coopsched
from coopsched.core import MODES


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = {}
    for mode in ("slice", "burst"):
        path = tmp_path_factory.mktemp("traces") / f"{mode}.json"
        assert coopsched(["run", "concurrency2", "--mode", mode, "--json", str(path)]) == 0
        out[mode] = path
    return out


def largest_gap(path) -> float:
    runs = json.loads(path.read_text())
    return max(b - a for run in runs for r in run["requests"] for a, b in pairwise(r["token_times_ms"]))


def judge(path, *args) -> tuple[int, dict]:
    out = path.with_suffix(".verdict.json")
    code = coopsched(["judge", str(path), *args, "--json", str(out)])
    return code, json.loads(out.read_text())


def test_a_limit_between_the_two_stalls_passes_slice_and_fails_burst(traces):
    slice_stall, burst_stall = largest_gap(traces["slice"]), largest_gap(traces["burst"])
    assert slice_stall * 5 < burst_stall  # the HOL block: the whole speculative request
    limit = f"itl_ms={(slice_stall + burst_stall) / 2:g}"
    code, verdict = judge(traces["slice"], "--slo", limit)
    assert code == 0 and verdict["slo_attainment"] == 1.0 and verdict["format"] == "trace"
    code, verdict = judge(traces["burst"], "--slo", limit)
    assert code == 1 and verdict["slo_attainment"] == 0.5
    assert verdict["worst_gaps"][0]["request"] == "classic" and verdict["worst_gaps"][0]["gap_ms"] == burst_stall
    assert [m["request"] for m in verdict["misses"]] == ["classic"]


@pytest.mark.parametrize("mode, exit_code, attainment", [("slice", 0, 1.0), ("burst", 1, 0.5)])
def test_itl_200_ms(traces, mode, exit_code, attainment):
    code, verdict = judge(traces[mode], "--slo", "itl_ms=200,ttft_ms=1000")
    assert (code, verdict["slo_attainment"], verdict["requests"]) == (exit_code, attainment, 2)


def test_a_bare_run_trace_is_judged_per_scenario_and_mode(tmp_path):
    path = tmp_path / "all.json"
    coopsched(["run", "concurrency2", "many-classic", "--mode", "all", "--json", str(path)])
    _code, verdict = judge(path, "--slo", "itl_ms=200")
    groups = verdict["groups"]
    assert set(groups) == {f"{s}/{m}" for s in ("concurrency2", "many-classic") for m in MODES}
    assert all(groups[g]["slo_attainment"] == 1.0 for g in groups if not g.endswith("/burst"))
    assert all(groups[g]["slo_attainment"] < 1.0 for g in groups if g.endswith("/burst"))
