"""`coopsched sweep` in virtual time: the per-token SLO separates the legacy burst from the slices,
a planted regression erases that, any --jobs gives the same bytes, and every bad option is one
line with exit 2 and no traceback."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
from factories import cli_error_line, mixed_workload

from coopsched.cli import main as cli
from coopsched.core import MODES, Scheduler
from harness.live.client import free_port
from harness.run import runner, scenario
from harness.run.slo import Slo
from harness.sweep import cli as sweep_cli
from harness.sweep import points
from mocks import CostModel

# poisson-mix's shape, 40 requests: the legacy burst stalls classic rows behind whole requests
MIXED = mixed_workload(40, accept_prob=0.6)
RATES = (2, 4, 6)
ITL_SLO = Slo(itl_ms=250.0)  # a gap limit only: a whole-request burst passes TTFT-free, its neighbours' stalls do not


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Every sweep stores reports/sweeps/latest.json under the working directory: keep it in tmp."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def mixed(tmp_path) -> Path:
    path = tmp_path / "mixed.toml"
    path.write_text(MIXED)
    return path


def sweep(path: Path, modes=MODES, seeds: int = 2, jobs: int = 1) -> dict:
    settings = sweep_cli.Settings(scenario.load(str(path)), "rate", RATES, tuple(modes), seeds, ITL_SLO, 0.9, jobs)
    return sweep_cli.Sweep(settings).run()


def attainment(result: dict, mode: str, load) -> float:
    return next(r["slo_attainment"] for r in result["summary"][mode] if r["load"] == load)


def test_slices_hold_the_per_token_slo_where_the_legacy_burst_fails_it(mixed):
    result = sweep(mixed)
    cap = result["capacity"]
    assert cap["burst"] is not None and cap["slice"] > cap["burst"]
    assert cap["fused"] >= cap["burst"] and cap["cost"] >= cap["burst"]
    held = [load for load in RATES if attainment(result, "slice", load) >= 0.9 > attainment(result, "burst", load)]
    assert held, result["summary"]
    # the burst misses on gaps (its neighbours' stalls), never on TTFT, which this SLO leaves free
    burst = [p for p in result["points"] if p["mode"] == "burst" and p["load"] in held]
    assert all(p["slo_misses"]["itl"] > 0 and p["slo_misses"]["ttft"] == 0 for p in burst)


def test_a_slice_mode_that_runs_requests_whole_loses_its_capacity(mixed, monkeypatch):
    """The capacity check can fail: slices planted back into whole-request bursts, in one process."""
    monkeypatch.setattr(runner, "make_scheduler", lambda kind, config, params: Scheduler(config.with_(mode="burst")))
    cap = sweep(mixed, modes=("burst", "slice"))["capacity"]
    assert not cap["slice"] > cap["burst"]


def test_any_jobs_gives_the_same_bytes(mixed, tmp_path):
    outs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}.json"
        assert cli(["sweep", str(mixed), "--rates", "2,6", "--seeds", "2", "--slo", "itl_ms=250",
                    "--jobs", jobs, "--json", str(out)]) == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert (tmp_path / sweep_cli.STORE).read_bytes() == outs[1]  # every finished sweep is stored for the report


def test_the_json_holds_the_contract_keys(mixed, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert cli(["sweep", str(mixed), "--rates", "4,2", "--mode", "slice", "--seeds", "2",
                "--slo", "itl_ms=250,ttft_ms=800", "--attainment", "0.8", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert {k: got[k] for k in ("scenario", "load_kind", "slo", "attainment")} == {
        "scenario": "mixed", "load_kind": "rate", "slo": {"itl_ms": 250.0, "ttft_ms": 800.0}, "attainment": 0.8}
    assert [(p["mode"], p["load"], p["seed"]) for p in got["points"]] == [
        ("slice", 2, 0), ("slice", 2, 1), ("slice", 4, 0), ("slice", 4, 1)]  # loads ascending, seeds 0..N-1
    keys = {"mode", "load", "seed", "requests", "classic_itl_p50_ms", "classic_itl_p99_ms", "classic_itl_max_ms",
            "itl_p99_ms", "ttft_p50_ms", "ttft_p95_ms", "aggregate_tok_s", "spec_tok_s", "goodput_rps",
            "slo_attainment"}
    assert all(keys <= set(p) and "metrics_delta" not in p and p["requests"] == 40 for p in got["points"])
    assert set(got["capacity"]) == {"slice"}
    out_text = capsys.readouterr().out
    assert "capacity (highest load" in out_text and "slice" in out_text


def test_a_cost_profile_prices_every_point_on_any_worker(mixed, tmp_path):
    """--cost prices the mock like a calibrated server: the same points as the profile's terms written
    into the workload's own [cost] table, shipped to worker processes too, and unlike the default mock's."""
    slow = CostModel.simple(decode_ms=20.0, round_ms=120.0)
    profile = tmp_path / "slow.json"
    profile.write_text(json.dumps(slow.to_json()))
    args = ["--rates", "2,6", "--mode", "slice", "--seeds", "1", "--slo", "itl_ms=250"]

    def points_of(path: Path, *extra: str) -> tuple[dict, list]:
        out = tmp_path / "s.json"
        assert cli(["sweep", str(path), *args, *extra, "--json", str(out)]) == 0
        got = json.loads(out.read_text())
        return got, got["points"]

    priced, priced_points = points_of(mixed, "--cost", str(profile), "--jobs", "2")
    assert priced["cost_profile"] == str(profile)
    inline = tmp_path / "inline.toml"
    inline.write_text(MIXED + "[cost]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in slow.to_json().items()
                                                   if v is not None and k != "seed"))
    assert points_of(inline)[1] == priced_points
    default, default_points = points_of(mixed)
    assert "cost_profile" not in default
    assert all(p["classic_itl_p50_ms"] > d["classic_itl_p50_ms"] for p, d in zip(priced_points, default_points))


def test_a_concurrency_sweep_runs_closed_loops(mixed):
    scen = scenario.load(str(mixed))
    (task,) = points.plan(scen, "concurrency", (3,), ("slice",), 1, ITL_SLO)
    workload = task.scenario.workload
    assert (workload.arrival, workload.concurrency, workload.rate_per_s) == ("closed", 3, None)
    settings = sweep_cli.Settings(scen, "concurrency", (1, 4), ("slice",), 1, ITL_SLO)
    one, four = sweep_cli.Sweep(settings).run()["points"]
    assert four["aggregate_tok_s"] > 1.5 * one["aggregate_tok_s"]  # four users keep more rows busy
    assert one["ttft_p95_ms"] < 30  # one user never queues behind another request


def test_explicit_requests_beside_the_workload_keep_their_arrivals(tmp_path):
    path = tmp_path / "probe.toml"
    path.write_text(MIXED + '[[requests]]\nid = "probe"\narrival_ms = 500\nmax_tokens = 30\nspeculative = false\n')
    (task,) = points.plan(scenario.load(str(path)), "rate", (4,), ("slice",), 1, ITL_SLO)
    specs = task.scenario.specs(0)
    assert specs[0].id == "probe" and specs[0].arrival_ms == 500 and len(specs) == 41
    assert points.run_point(task)["requests"] == 41


# -- could not run: one line, exit 2 ---------------------------------------------------------------
CLOSED = '[workload]\nnum_requests = 5\narrival = "closed"\nconcurrency = 2\n'
DEAD_PORT = free_port()  # nothing listens there

BAD = [  # id, arguments after the scenario (None: the mixed file), fragments of the one line
    ("no-load", [], ["give exactly one of --rates", "--concurrency", "got neither"]),
    ("both-loads", ["--rates", "2", "--concurrency", "2"], ["give exactly one of", "got both"]),
    ("rates-empty-item", ["--rates", "2,,4"], ["--rates '2,,4' has an empty item", "decimal numbers > 0"]),
    ("rates-word", ["--rates", "2,fast"], ["--rates item 'fast'", "decimal numbers > 0 (requests/s)"]),
    ("rates-zero", ["--rates", "0"], ["--rates item '0'"]),
    ("rates-negative", ["--rates=-2"], ["--rates item '-2'"]),
    ("rates-inf", ["--rates", "inf"], ["--rates item 'inf'"]),
    ("rates-twice", ["--rates", "2,4,2.0"], ["--rates names 2.0 twice"]),
    ("concurrency-fraction", ["--concurrency", "1.5"], ["--concurrency item '1.5'", "whole numbers >= 1 (users)"]),
    ("concurrency-zero", ["--concurrency", "0,2"], ["--concurrency item '0'"]),
    ("mode-unknown", ["--rates", "2", "--mode", "turbo"], ["--mode 'turbo'", "burst, slice, fused, cost or all"]),
    ("seeds-zero", ["--rates", "2", "--seeds", "0"], ["--seeds '0'", "whole number >= 1"]),
    ("seeds-word", ["--rates", "2", "--seeds", "three"], ["--seeds 'three'"]),
    ("slo-unknown-key", ["--rates", "2", "--slo", "itl=50"], ["--slo key 'itl' is unknown", "itl_ms, ttft_ms"]),
    ("slo-zero", ["--rates", "2", "--slo", "itl_ms=0"], ["--slo itl_ms='0'", "> 0"]),
    ("attainment-above-one", ["--rates", "2", "--attainment", "1.5"], ["--attainment '1.5'", "between 0 and 1"]),
    ("jobs-zero", ["--rates", "2", "--jobs", "0"], ["--jobs '0'", "whole number >= 1"]),
    ("cluster-no-scheme", ["--rates", "2", "--cluster", "127.0.0.1:8786"],
     ["--cluster '127.0.0.1:8786'", "tcp://HOST:PORT"]),
    ("cluster-and-jobs", ["--rates", "2", "--cluster", "tcp://127.0.0.1:8786", "--jobs", "2"],
     ["--jobs 2 with --cluster", "drop --jobs"]),
    ("target-and-jobs", ["--rates", "2", "--target", "http://127.0.0.1:1", "--jobs", "2"],
     ["runs the points one at a time", "drop --jobs"]),
    ("target-and-cluster", ["--rates", "2", "--target", "http://127.0.0.1:1", "--cluster", "tcp://h:1"],
     ["drop --cluster"]),
    ("target-not-http", ["--rates", "2", "--target", "ftp://example"], ["--target 'ftp://example'", "http://HOST:PORT"]),
    ("verify-points-without-target", ["--rates", "2", "--verify-points", "2"],
     ["--verify-points 2 runs some of a twin's points live", "--cost PROFILE.json", "--target URL"]),
    ("verify-points-zero", ["--rates", "2", "--cost", "p.json", "--target", "http://127.0.0.1:1",
                            "--verify-points", "0"], ["--verify-points '0'", "whole number >= 1"]),
    ("cost-unreadable", ["--rates", "2", "--cost", "no-such-profile.json"],
     ["cannot read cost profile no-such-profile.json"]),
    ("grant-interval-and-target", ["--rates", "2", "--prefill-grant-interval", "4", "--target", "http://127.0.0.1:1"],
     ["--prefill-grant-interval 4 sets the virtual-time scheduler", "drop one"]),
    ("grant-interval-negative", ["--rates", "2", "--prefill-grant-interval", "-1"],
     ["prefill_grant_interval=-1", "[0, 2**32)"]),
    ("target-unreachable", ["--rates", "2", "--target", f"http://127.0.0.1:{DEAD_PORT}"],
     [f"--target http://127.0.0.1:{DEAD_PORT}: no server answered"]),
]


@pytest.mark.parametrize(("args", "fragments"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_option_is_one_line_naming_the_value(mixed, capsys, args, fragments):
    line = cli_error_line(capsys, ["sweep", str(mixed), *args])
    for fragment in fragments:
        assert fragment in line
    assert not Path(sweep_cli.STORE).exists()  # nothing ran, nothing stored


SCENARIOS = [  # id, scenario text (None: a shipped name), arguments, fragments
    ("no-workload", "concurrency2", ["--rates", "2"], ["scenario 'concurrency2' has no [workload]",
                                                       "cannot be swept"]),
    ("rates-on-a-closed-loop", CLOSED, ["--rates", "2"], ["--rates: scenario 'x' is a closed loop",
                                                          "use --concurrency"]),
    ("unknown-scenario", "no-such-scenario", ["--rates", "2"], ["unknown scenario 'no-such-scenario'"]),
    ("bad-workload", MIXED.replace("rate_per_s = 8", "rate_per_s = 0"), ["--rates", "2"], ["rate_per_s = 0"]),
]


@pytest.mark.parametrize(("text", "args", "fragments"), [s[1:] for s in SCENARIOS], ids=[s[0] for s in SCENARIOS])
def test_a_scenario_that_cannot_be_swept_says_why(tmp_path, capsys, text, args, fragments):
    (tmp_path / "t.jsonl").write_text('{"arrival_ms": 0, "prompt_len": 3}\n')
    name = text
    if "\n" in text:
        name = str(tmp_path / "x.toml")
        Path(name).write_text(text)
    line = cli_error_line(capsys, ["sweep", name, *args])
    for fragment in fragments:
        assert fragment in line


def test_without_dask_the_cluster_option_says_what_to_install(mixed, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    line = cli_error_line(capsys, ["sweep", str(mixed), "--rates", "2", "--cluster", "tcp://127.0.0.1:8786"])
    assert "--cluster needs dask.distributed" in line and "[cluster]" in line


def test_a_low_attainment_is_a_result_not_an_error(mixed, capsys):
    assert cli(["sweep", str(mixed), "--rates", "6", "--mode", "burst", "--seeds", "1", "--slo", "itl_ms=1"]) == 0
    assert "burst none" in capsys.readouterr().out


def test_the_grant_interval_flag_wins_over_the_gate(mixed, monkeypatch):
    monkeypatch.setenv("MLXCEL_PREFILL_GRANT_INTERVAL", "3")
    parser = argparse.ArgumentParser()
    sweep_cli.add_arguments(parser)
    settings = sweep_cli.settings_from(parser.parse_args([str(mixed), "--rates", "2", "--prefill-grant-interval", "7"]))
    (task, *_) = sweep_cli.Sweep(settings).tasks
    assert task.config.prefill_grant_interval == 7
    settings = sweep_cli.settings_from(parser.parse_args([str(mixed), "--rates", "2"]))
    assert sweep_cli.Sweep(settings).tasks[0].config.prefill_grant_interval == 3
