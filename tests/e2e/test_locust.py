"""`locust -f scenarios/concurrency2.py`: its defaults, its verdicts, and servers that stream several tokens per event.

Locust runs in its own processes (gevent patches the stdlib on import), never
inside pytest. Real time on a small shared machine: a foreign CPU stall may push a
slice-mode gap over its limit, which the stall rule (harness/live/stalls.py) calls
noise; the burst run misses its bound by >10x with a whole reply inside the gap.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_servers import clean_env, serve

from coopsched.cli import main as coopsched
from harness.live.client import free_port

pytestmark = pytest.mark.e2e

LOCUSTFILE = Path(__file__).resolve().parents[2] / "scenarios" / "concurrency2.py"
FAKE_SERVER = Path(__file__).with_name("multitoken_server.py")
HEADLESS = ["--headless", "-u", "2", "-r", "2", "--only-summary"]
DEFAULT_REPORT = Path("reports/locust/concurrency2.json")  # relative to locust's working directory


def judge(args: list[str]) -> int:
    return coopsched(["judge", *args])


def locust(*args: str, cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_locust(tmp_path: Path, *args: str, env: dict | None = None, timeout_s: float = 150) -> tuple[int, dict, str]:
    """Run locust to its end in tmp_path; (exit code, report, output). No --report-json: the default path."""
    for old in tmp_path.glob("reports/locust/*.json"):
        old.unlink()
    proc = locust(*args, cwd=tmp_path, env=env or clean_env())
    output, _ = proc.communicate(timeout=timeout_s)
    report_path = tmp_path / DEFAULT_REPORT
    assert report_path.exists(), output[-3000:]
    return proc.returncode, json.loads(report_path.read_text()), output


def test_bare_headless_run_stops_by_itself_and_passes_in_slice_mode(tmp_path):
    """No -u, -r, -t, --host: one user of each kind for 20 s on its own mock server, then it stops."""
    began = time.monotonic()
    code, report, output = run_locust(tmp_path, "--headless")
    wall_s = time.monotonic() - began
    assert code == 0, output[-3000:]
    assert report["ok"] and report["verdict"] == "pass" and report["mode"] == "slice" and report["failures"] == 0
    assert report["users"] == 2 and report["run_time_s"] == 20 and 19 <= report["duration_s"] <= 25
    assert wall_s < 60, wall_s  # it stopped by itself
    assert report["requests"]["classic"] > 0 and report["requests"]["spec"] > 0
    assert report["samples"]["classic"] > 100 and report["samples"]["spec"] > 100
    assert report["bound_ms"] == 35.0 and report["calibration"] == "costs"  # decode 5 + round 30, from /health
    assert {c["name"]: c["ok"] for c in report["checks"]} == {
        "classic_itl_p99": True, "classic_itl": True, "failures": True, "locust_failures": True}
    # a gap over a limit is noise (counted at the limit): no stream got more than one round in it
    assert report["classic_itl_p99_charged_ms"] <= report["p99_limit_ms"]
    assert report["classic_itl_max_charged_ms"] <= report["gap_limit_ms"]
    every_gap = report["stalls"]["every_gap"]
    assert every_gap["timeline"] == "server tick ends" and every_gap["hol"] == 0
    assert every_gap["max_evidence_tokens"] <= 5  # one round of K = 4, or slice 0 + a round
    # the optional per-request list: every finished request with its token times (for `coopsched judge`)
    finished = [r for r in report["per_request"] if not r["cut_by_stop"]]
    assert {r["kind"] for r in finished} == {"classic", "spec"}
    assert all(len(r["token_times_ms"]) == (128 if r["kind"] == "classic" else 64) for r in finished)
    verdict_path = tmp_path / "verdict.json"
    code = judge([str(tmp_path / DEFAULT_REPORT), "--slo", f"itl_ms={report['gap_limit_ms']}", "--json",
                  str(verdict_path)])
    verdict = json.loads(verdict_path.read_text())
    assert code in (0, 1) and verdict["format"] == "locust" and verdict["requests"] == len(finished)
    assert set(verdict["groups"]) == {"classic", "spec"}  # attainment per kind


def test_an_explicit_run_time_wins_over_the_default(tmp_path):
    began = time.monotonic()
    _code, report, output = run_locust(tmp_path, "--headless", "--only-summary", "-t", "3s")  # any but 20
    wall_s = time.monotonic() - began
    assert report["run_time_s"] == 3 and report["duration_s"] < 8, output[-3000:]
    assert wall_s < 20 and report["users"] == 2


def test_burst_mode_exits_non_zero(tmp_path):
    # 4 s, not 10: the whole burst is inside a gap either way (max gap 2.4x of 5 x the limit at 4 s, 2.8x
    # at 10 s; 64 of 64 tokens of evidence in both, quiet machine)
    code, report, output = run_locust(tmp_path, *HEADLESS, "-t", "4s", env=clean_env(MLXCEL_MTP_TICK_SLICE="0"))
    assert code == 1, output[-3000:]
    assert report["mode"] == "burst" and report["ok"] is False and report["failures"] == 0
    assert report["classic_itl_max_ms"] > 5 * report["gap_limit_ms"]  # the whole burst, not a round
    worst = report["stalls"]["every_gap"]["worst_hol"]  # ... with the whole speculative reply inside the gap
    assert worst["evidence_tokens"] >= 60 > 5 * worst["allowance_tokens"]


@pytest.mark.parallel  # what was counted, never how fast
def test_a_kind_without_samples_is_neither_pass_nor_fail(tmp_path):
    code, report, output = run_locust(tmp_path, "--headless", "--only-summary", "-u", "1", "-t", "3s", "ClassicUser")
    assert code == 2, output[-3000:]
    assert report["ok"] is None and report["verdict"] == "no samples" and report["missing"] == ["spec"]
    assert [c["name"] for c in report["checks"] if c.get("skipped")] == ["classic_itl"]  # a skip, never a pass
    assert report["samples"]["classic"] > 0 and "spec" in report["rule"]


@pytest.mark.parallel  # what was counted, never how fast
def test_failed_requests_fail_the_run_even_without_samples(tmp_path):
    code, report, output = run_locust(tmp_path, "--headless", "--only-summary", "-u", "2", "-r", "2", "-t", "2s",
                                      "--host", f"http://127.0.0.1:{free_port()}",  # nothing listens there
                                      "--bound-ms", "35", "--slice0-ms", "5")
    assert code == 1, output[-3000:]
    assert report["ok"] is False and report["verdict"] == "fail" and report["locust_failures"] > 0
    assert sorted(report["missing"]) == ["classic", "spec"]


@pytest.mark.parallel  # what was counted, never how fast
def test_distributed_run_merges_every_worker_sample(tmp_path):
    report_path = tmp_path / "report.json"
    port = str(free_port())
    env = clean_env()
    master = locust(*HEADLESS, "-t", "10s", "--master", "--master-bind-host", "127.0.0.1",
                    "--master-bind-port", port, "--expect-workers", "2", "--report-json", str(report_path),
                    cwd=tmp_path, env=env)
    workers = [locust("--worker", "--master-host", "127.0.0.1", "--master-port", port, cwd=tmp_path, env=env)
               for _ in range(2)]
    output, _ = master.communicate(timeout=150)
    for worker in workers:
        worker.communicate(timeout=30)
    report = json.loads(report_path.read_text())
    assert report["distributed"], output[-3000:]
    per_worker = report["workers"]
    assert len(per_worker) == 2 and all(sum(c.values()) > 0 for c in per_worker.values())
    for kind in ("classic", "spec"):
        merged = sum(c[kind] for c in per_worker.values())
        assert merged == report["samples"][kind] == report["locust_reported_gaps"][kind] > 0
    assert {r["worker"] for r in report["per_request"]} == set(per_worker)


# -- servers that send several tokens per event and report no costs ------------------------------
def fake_server(*args: str):
    return serve(command=[sys.executable, str(FAKE_SERVER), *args])


@pytest.mark.parallel  # tokens counted per event, never how fast
@pytest.mark.parametrize("stream_kind", ["token-ids", "text-and-usage"])
def test_multi_token_events_are_counted_as_tokens_and_calibrated_solo(tmp_path, stream_kind):
    """3 tokens per speculative event (as vLLM sends them): 64 tokens per request, not 22 events; the
    server reports no costs, so each kind runs alone first instead of the run failing for want of a bound."""
    args = ["--tokens-per-event", "3"] + (["--text-only"] if stream_kind == "text-and-usage" else [])
    with fake_server(*args) as served:
        _code, report, output = run_locust(tmp_path, "--headless", "--only-summary", "-t", "5s", "--host", served.url)
    assert report["failures"] == 0 and report["locust_failures"] == 0, output[-3000:]
    assert report["calibration"] == "solo" and report["ok"] is not None and report["bound_ms"] is None
    assert report["solo"]["spec"]["num_tokens"] == 64 and report["solo"]["classic"]["num_tokens"] == 128
    finished = [r for r in report["per_request"] if not r["cut_by_stop"]]
    assert all(len(r["token_times_ms"]) == (64 if r["kind"] == "spec" else 128) for r in finished)
    assert report["tokens"]["spec"] > 2.5 * report["events"]["spec"]  # 22 events per 64 tokens
    spec_times = next(r["token_times_ms"] for r in finished if r["kind"] == "spec")
    assert spec_times[0] == spec_times[1] == spec_times[2] < spec_times[3]  # one arrival, zero gaps inside


def test_a_server_that_serializes_requests_fails_on_ttft_against_its_solo_figures(tmp_path):
    with fake_server("--serialize") as served:
        # 3 s, not 5: the worst spec TTFT is 5.1x of twice its limit at either length (quiet machine)
        code, report, output = run_locust(tmp_path, "--headless", "--only-summary", "-t", "3s", "--host", served.url)
    assert code == 1 and report["ok"] is False and report["failures"] == 0, output[-3000:]
    # each request waits out the other kind's whole generation: far past 3 x solo + 25 ms
    spec_ttft = max(r["token_times_ms"][0] - r["arrival_ms"] for r in report["per_request"]
                    if r["kind"] == "spec" and r["token_times_ms"])
    assert spec_ttft > 2 * report["solo_limits"]["spec"]["ttft_limit_ms"]
