"""`locust -f scenarios/concurrency2.py` against the mock server it starts: slice passes, burst fails.

Locust runs in its own processes (gevent patches the stdlib on import), never
inside pytest. Real time on a small shared machine: the slice run gets one
retry to absorb a foreign CPU stall; the burst run misses its bound by >10x.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from e2e_servers import clean_env

pytestmark = pytest.mark.e2e

LOCUSTFILE = Path(__file__).resolve().parents[2] / "scenarios" / "concurrency2.py"
HEADLESS = ["--headless", "-u", "2", "-r", "2", "--only-summary"]


def locust(*args: str, cwd: Path, env: dict, timeout_s: float = 150) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_headless(tmp_path: Path, env: dict, seconds: int = 20) -> tuple[int, dict, str]:
    report = tmp_path / "report.json"
    proc = locust(*HEADLESS, "-t", f"{seconds}s", "--report-json", str(report), cwd=tmp_path, env=env)
    output, _ = proc.communicate(timeout=seconds + 120)
    return proc.returncode, json.loads(report.read_text()), output


def test_slice_mode_exits_zero(tmp_path):
    for attempt in range(2):
        code, report, output = run_headless(tmp_path, clean_env())
        if code == 0:
            break
    assert code == 0, output[-3000:]
    assert report["ok"] and report["mode"] == "slice" and report["failures"] == 0
    assert report["samples"]["classic"] > 100 and report["samples"]["spec"] > 100
    assert report["bound_ms"] == 35.0  # decode 5 + round 30, from the server's /health costs
    assert report["classic_itl_p99_ms"] <= report["p99_limit_ms"]
    assert report["classic_itl_max_ms"] <= report["gap_limit_ms"]


def test_burst_mode_exits_non_zero(tmp_path):
    code, report, output = run_headless(tmp_path, clean_env(MLXCEL_MTP_TICK_SLICE="0"))
    assert code != 0, output[-3000:]
    assert report["mode"] == "burst" and not report["ok"] and report["failures"] == 0
    assert report["classic_itl_max_ms"] > 5 * report["gap_limit_ms"]  # the whole burst, not a round


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
