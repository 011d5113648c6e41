"""Live verdicts against a server that reports nothing about itself, and closed loops run live.

`coopsched serve` behind tests/e2e/hiding_proxy.py answers /health with a bare status and
streams no tick stamps or BurstFinalized records (as vLLM, llama.cpp and mlx_lm.server): the
legacy burst must fail `run --target` and locust, at the mock's default costs and fast ones,
and slice mode pass. Servers (and the proxy) run on one core and clients on the other.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from e2e_servers import clean_env, serve

pytestmark = pytest.mark.e2e

PROXY = Path(__file__).with_name("hiding_proxy.py")
LOCUSTFILE = Path(__file__).resolve().parents[2] / "scenarios" / "concurrency2.py"
CPUS = sorted(os.sched_getaffinity(0))
PINNED = len(CPUS) > 1 and shutil.which("taskset") is not None
COSTS = {"default": ("5", "30"), "fast": ("0.3", "1.5")}
# at fast costs the legacy burst's reply arrives as a lump 1.5x over its allowance and --target's worst
# slice lump 0.86x of it; locust's slice lumps reach 0.93-1.17x of it with two busy loops beside, so its
# fast run stays in `tox -e live-edge` (docs/measurements/2026-12-02-live-verdict-lumps.md)
COST_PARAMS = ["default", "fast"]
LOCUST_COST_PARAMS = [pytest.param("default"), pytest.param("fast", marks=pytest.mark.edge)]
# every key CONTRACTS pins on a trace, a request and a check
PINNED_TRACE_KEYS = {"scenario", "mode", "clock", "seed", "requests", "ticks", "bursts", "checks", "throughput"}
PINNED_REQUEST_KEYS = {"id", "speculative", "eligible", "prompt_token_ids", "token_ids", "token_times_ms",
                       "arrival_ms", "finish_reason"}
PINNED_CHECK_KEYS = {"name", "ok", "value", "bound"}


def on_cpu(cpu: int, command: list[str]) -> list[str]:
    return ["taskset", "-c", str(CPUS[cpu]), *command] if PINNED else command


@contextmanager
def hidden(mode: str, costs: str, *proxy_args: str):
    """`coopsched serve` in `mode` at `costs`, seen through the hiding proxy: yields the proxy's URL."""
    decode, round_ms = COSTS[costs]
    env = clean_env(MLXCEL_MTP_TICK_SLICE="0" if mode == "burst" else "1")
    server = on_cpu(0, [sys.executable, "-m", "coopsched.cli", "serve", "--host", "127.0.0.1", "--port", "0",
                        "--decode-ms", decode, "--round-ms", round_ms])
    with serve(command=server, env=env) as served:
        proxy = on_cpu(0, [sys.executable, str(PROXY), "--upstream", served.url, *proxy_args])
        with serve(command=proxy) as proxied:
            yield proxied.url


def run_target(url: str, tmp_path: Path, name: str = "concurrency2") -> tuple[int, dict, str]:
    trace_path = tmp_path / "trace.json"
    proc = subprocess.run(on_cpu(-1, [sys.executable, "-m", "coopsched.cli", "run", name, "--target", url,
                                      "--json", str(trace_path)]),
                          capture_output=True, text=True, timeout=300, env=clean_env())
    trace = json.loads(trace_path.read_text())[0] if trace_path.exists() else {}
    return proc.returncode, trace, proc.stdout + proc.stderr


def checks_of(trace: dict) -> dict:
    return {c["name"]: c for c in trace["checks"]}


@pytest.mark.parametrize("costs", COST_PARAMS)
@pytest.mark.parametrize("mode", ["burst", "slice"])
def test_target_behind_a_server_that_reports_nothing(tmp_path, mode, costs):
    with hidden(mode, costs) as url:
        code, trace, output = run_target(url, tmp_path)
    checks = checks_of(trace)
    assert trace["mode"] == "external" and "solo" in trace and trace["bursts"] == [], output
    stall = checks["stall_vs_solo"]
    assert stall["stalls"]["timeline"] == "client arrivals"
    assert set(stall["limits"]["classic"]) == {"figure_ms", "limit_ms", "floor_ms", "ceiling_ms"}
    assert "floor" in stall["note"] and "ceiling" in stall["note"]
    if mode == "burst":
        assert code == 1 and not stall["ok"], output
        worst = stall["stalls"]["worst_hol"]  # the speculative reply inside one classic gap, as one lump
        assert worst["stream"] == "classic" and worst["by"] == "spec" and worst["measure"] == "lump"
        assert worst["evidence_tokens"] > worst["allowance_tokens"]
    else:
        assert code == 0, output
        assert stall["stalls"]["hol"] == 0


def run_locust(url: str, tmp_path: Path, seconds: int = 4) -> tuple[int, dict, str]:
    report = tmp_path / "locust.json"
    proc = subprocess.run(on_cpu(-1, [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
                                      "--only-summary", "-t", f"{seconds}s", "--host", url,
                                      "--report-json", str(report)]),
                          capture_output=True, text=True, timeout=150, cwd=tmp_path, env=clean_env())
    output = proc.stdout + proc.stderr
    assert report.exists(), output[-3000:]
    return proc.returncode, json.loads(report.read_text()), output


@pytest.mark.parametrize("costs", LOCUST_COST_PARAMS)
@pytest.mark.parametrize("mode", ["burst", "slice"])
def test_locust_behind_a_server_that_reports_nothing(tmp_path, mode, costs):
    # the solo limits' ceiling (half the other kind's solo run) keeps a fast burst over its limit
    with hidden(mode, costs) as url:
        code, report, output = run_locust(url, tmp_path)
    assert report["calibration"] == "solo" and report["failures"] == 0, output[-3000:]
    waits = report["stalls"]["waits"]
    if mode == "burst":
        assert code == 1 and report["ok"] is False and waits["hol"] > 0, output[-3000:]
        assert waits["worst_hol"]["evidence_tokens"] > waits["worst_hol"]["allowance_tokens"]
    else:
        assert code == 0 and report["ok"] is True and waits["hol"] == 0, output[-3000:]


@pytest.mark.parallel  # which requests were speculated and which check was skipped, never how fast
def test_a_classic_request_the_server_speculated_is_not_judged_as_classic(tmp_path):
    """llama.cpp ignores `speculative: false`; its `timings.draft_n` says it speculated."""
    with hidden("slice", "fast", "--speculate-all") as url:
        _code, trace, output = run_target(url, tmp_path)
    by_id = {r["id"]: r for r in trace["requests"]}
    assert by_id["classic"]["eligible"] is False and by_id["classic"]["speculative"] is True, output
    assert by_id["classic"]["timings"]["draft_n"] > 0
    assert trace["speculated_against_ask"] == ["classic"]
    assert "classic: sent speculative: false, the server speculated it" in output
    served = checks_of(trace)["classic_served"]
    assert served["skipped"] and "whether classic streams stall was not tested" in served["note"]


APART = """
[checks]
classic_itl = {}

[[requests]]
id = "classic"
max_tokens = 16
speculative = false

[[requests]]
id = "spec"
arrival_ms = 1500
max_tokens = 16
"""


def test_checks_that_need_overlap_are_skipped_when_nothing_overlapped_and_the_schedule_adapts(tmp_path):
    path = tmp_path / "apart.toml"
    path.write_text(APART)
    with serve("--decode-ms", "0.3", "--round-ms", "1.5") as served:  # reports costs: arrivals as written
        code, trace, output = run_target(served.url, tmp_path, str(path))
    gap = checks_of(trace)["classic_itl"]
    assert code == 0 and gap["skipped"] and "no two requests overlapped" in gap["note"], output
    with hidden("slice", "fast") as url:  # reports nothing: the schedule scales to the solo runs
        code, trace, output = run_target(url, tmp_path, str(path))
    assert trace["schedule"]["scale"] < 0.1 and "first half of the solo run" in trace["schedule"]["note"], output
    classic, spec = (next(r for r in trace["requests"] if r["id"] == i) for i in ("classic", "spec"))
    assert spec["arrival_ms"] < classic["token_times_ms"][-1]  # they overlapped
    assert not checks_of(trace)["stall_vs_solo"].get("skipped")


CLOSED = """
[workload]
arrival = "closed"
num_requests = 8
concurrency = 2
max_tokens = 12
prompt_len = 8
speculative_share = 0.5
"""


def test_a_closed_loop_workload_runs_live_with_at_most_its_users_in_flight(tmp_path):
    path = tmp_path / "my-load.toml"
    path.write_text(CLOSED)
    with serve("--decode-ms", "1", "--round-ms", "4") as served:
        code, trace, output = run_target(served.url, tmp_path, str(path))
    assert code == 0, output
    assert PINNED_TRACE_KEYS <= set(trace) and trace["clock"] == "real"
    assert all(PINNED_REQUEST_KEYS <= set(r) for r in trace["requests"])
    assert all(PINNED_CHECK_KEYS <= set(c) for c in trace["checks"])
    requests = trace["requests"]
    assert len(requests) == 8 and all(r["finish_reason"] == "length" and r["num_tokens"] == 12 for r in requests)
    spans = [(r["arrival_ms"], r["end_ms"]) for r in requests]
    most = max(sum(a <= t < b for a, b in spans) for t, _ in spans)
    assert most == 2  # both users busy, never a third request
    assert checks_of(trace)["in_flight"]["value"] == 2 and checks_of(trace)["in_flight"]["ok"]
    # a user sends its next request only once its previous one ended
    starts = sorted(a for a, _ in spans)[2:]
    ends = sorted(b for _, b in spans)
    assert all(start >= end for start, end in zip(starts, ends))
