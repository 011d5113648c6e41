"""What the tests against other servers share (test_vllm_interop, test_llamacpp): the server on one
core and the clients on the others, the results file the docs' figures come from, and one run of
`coopsched run concurrency2 --target` and of the concurrency2 locust file against a URL.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from e2e_servers import clean_env

LOCUSTFILE = Path(__file__).resolve().parents[2] / "scenarios" / "concurrency2.py"
CPUS = sorted(os.sched_getaffinity(0))
PINNED = len(CPUS) > 1 and shutil.which("taskset") is not None
SERVER_CPU, CLIENT_CPUS = CPUS[-1], ",".join(map(str, CPUS[:-1]))


def on_cpus(cpus: int | str, command: list[str]) -> list[str]:
    return ["taskset", "-c", str(cpus), *command] if PINNED else command


def coopsched(*args: str, cwd: Path, timeout_s: float = 900) -> subprocess.CompletedProcess:
    """A coopsched command on the client cores."""
    return subprocess.run(on_cpus(CLIENT_CPUS, [sys.executable, "-m", "coopsched.cli", *args]), capture_output=True,
                          text=True, timeout=timeout_s, env=clean_env(), cwd=cwd)


class Results:
    """What each tool measured, per config, kept in a JSON file (the docs' figures are written from it)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, config: str, tool: str, value) -> None:
        data = json.loads(self.path.read_text()) if self.path.exists() else {}
        data.setdefault(config, {})[tool] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(data, indent=1) + "\n")


def target_run(url: str, tmp_path: Path, timeout_s: float = 900) -> tuple[dict, dict]:
    """`coopsched run concurrency2 --target URL`: its figures (exit, verdict, tokens alone and together)
    and its checks by name, for the caller to keep what it reads of them."""
    trace_path = tmp_path / "trace.json"
    trace_path.unlink(missing_ok=True)
    proc = coopsched("run", "concurrency2", "--target", url, "--json", str(trace_path), cwd=tmp_path,
                     timeout_s=timeout_s)
    assert trace_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    trace = json.loads(trace_path.read_text())[0]
    figures = {"exit": proc.returncode, "verdict": "pass" if proc.returncode == 0 else "fail",
               "tokens": {r["id"]: r["num_tokens"] for r in trace["requests"]},
               "solo_tokens": {i: s["num_tokens"] for i, s in trace.get("solo", {}).items()}}
    return figures, {c["name"]: c for c in trace["checks"]}


def locust_run(url: str, tmp_path: Path) -> tuple[dict, dict, Path]:
    """The concurrency2 locust file for 5 s against URL: its figures, its whole report and the report's
    path (a new one each run, so a run whose verdict disagrees keeps its report in the test's tmp dir)."""
    report_path = tmp_path / f"locust-{len(list(tmp_path.glob('locust-*.json')))}.json"
    proc = subprocess.run(on_cpus(CLIENT_CPUS, [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary", "-t", "5s",
        "--host", url, "--report-json", str(report_path)]), capture_output=True, text=True, timeout=600,
        env=clean_env(), cwd=tmp_path)
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    finished = [r for r in report["per_request"] if not r["cut_by_stop"]]
    figures = {"exit": proc.returncode, "verdict": report["verdict"], "calibration": report["calibration"],
               "tokens": report["tokens"], "events": report["events"], "failures": report["failures"],
               "locust_failures": report["locust_failures"],
               "finished": {k: [len(r["token_times_ms"]) for r in finished if r["kind"] == k]
                            for k in ("classic", "spec")},
               "solo_tokens": {k: v["num_tokens"] for k, v in (report.get("solo") or {}).items()},
               "failed": {c["name"]: {"value": c["value"], "bound": c["bound"], "note": c["note"][:600]}
                          for c in report.get("checks") or [] if c["ok"] is False}}  # why a verdict failed
    return figures, report, report_path


def assert_every_token_counted(targets: list[dict], locusts: list[dict]) -> None:
    """concurrency2's every request's every token, alone and together: 128 classic and 96 speculative
    through --target, 128 and 64 through locust (whose replies the stop may cut), and a speculative
    reply run to its end."""
    for t in targets:
        assert t["tokens"] == {"classic": 128, "spec": 96} and t["solo_tokens"] == t["tokens"], t
        assert "completed" not in t["failed"] and "parity_vs_solo" not in t["failed"], t
    for r in locusts:
        assert r["failures"] == 0 and r["locust_failures"] == 0 and r["calibration"] == "solo", r
        assert r["solo_tokens"] == {"classic": 128, "spec": 64}, r
        assert set(r["finished"]["classic"]) <= {128} and set(r["finished"]["spec"]) <= {64}, r
        assert r["finished"]["spec"], r
