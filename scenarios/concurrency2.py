"""Locust: one speculative and one classic streaming user; exact TTFT/ITL percentiles against the bound.

    locust -f scenarios/concurrency2.py --headless -u 2 -r 2 -t 20s [--host URL] [--report-json PATH]

Every token's arrival is kept raw (perf_counter_ns), never through locust's
rounded stats; percentiles are numpy's. The bound b = decode step + one round
(from the server's /health costs, or --bound-ms): the run passes iff classic ITL
p99 <= 1.5 b + 5 ms and every classic gap <= 1.5 (b + slice 0) + 10 ms (a
speculative admission puts slice 0 and round 1 back to back; real time gets
1.5x). With no --host a mock server (--decode-ms 5 --round-ms 30) is started on a
free loopback port. Workers send their raw samples to the master with each stats
report, so a distributed run judges every sample. Exit status: non-zero iff the
bound fails or requests failed.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import numpy as np
from locust import User, constant, events, task
from locust.runners import MasterRunner, WorkerRunner

KINDS = ("classic", "spec")
# short prompts: slice 0 stays small, so admissions (slice 0 + round 1) do not dominate the p99
PROMPTS = {"classic": "The classic row.", "spec": "Speculate, then verify."}
MAX_TOKENS = {"classic": 128, "spec": 64}
MOCK_ARGS = ("--decode-ms", "5", "--round-ms", "30")
DEFAULT_REPORT = Path("reports/locust/concurrency2.json")
REAL_TIME_ALLOWANCE = 1.5


class Samples:
    """Raw per-kind samples in ns; `pending` is what a worker has not yet sent to the master."""

    def __init__(self) -> None:
        self.data = self._empty()
        self.pending = self._empty()
        self.by_worker: dict[str, dict[str, int]] = {}

    @staticmethod
    def _empty() -> dict:
        return {kind: {"ttft_ns": [], "gaps_ns": [], "requests": 0, "failures": 0, "prompt_tokens": []}
                for kind in KINDS}

    def add(self, kind: str, sample: dict) -> None:
        for store in (self.data, self.pending):
            for key in ("ttft_ns", "gaps_ns", "prompt_tokens"):
                store[kind][key] += sample.get(key, [])
            store[kind]["requests"] += 1
            store[kind]["failures"] += int(bool(sample.get("failed")))

    def take_pending(self) -> dict:
        pending, self.pending = self.pending, self._empty()
        return pending

    def merge(self, client_id: str, part: dict) -> None:
        counts = self.by_worker.setdefault(client_id, {kind: 0 for kind in KINDS})
        for kind in KINDS:
            for key in ("ttft_ns", "gaps_ns", "prompt_tokens"):
                self.data[kind][key] += part[kind][key]
            self.data[kind]["requests"] += part[kind]["requests"]
            self.data[kind]["failures"] += part[kind]["failures"]
            counts[kind] += len(part[kind]["gaps_ns"])


SAMPLES = Samples()
STATE: dict = {"server": None, "costs": None, "mode": None}


# -- the users -------------------------------------------------------------------
class StreamingUser(User):
    abstract = True
    kind = "classic"
    wait_time = constant(0)

    @task
    def stream(self) -> None:
        url = urllib.parse.urlsplit(self.environment.host)
        body = {"prompt": PROMPTS[self.kind], "max_tokens": MAX_TOKENS[self.kind], "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True},
                "speculative": self.kind == "spec"}
        if STATE.get("model"):
            body["model"] = STATE["model"]
        sent = time.perf_counter_ns()
        arrivals: list[int] = []
        sample: dict = {"failed": None}
        conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=120)
        try:
            conn.request("POST", url.path.rstrip("/") + "/v1/completions", json.dumps(body),
                         {"Content-Type": "application/json", "Accept": "text/event-stream"})
            response = conn.getresponse()
            if response.status != 200:
                sample["failed"] = f"HTTP {response.status}: {response.read()[:200]!r}"
                return
            sample["failed"] = self._read_events(response, arrivals, sample)
        except Exception as exc:  # noqa: BLE001 - any transport error is a failed request
            sample["failed"] = repr(exc)
        finally:  # also on GreenletExit when the run ends: what arrived is still a valid sample
            conn.close()
            self._record(sent, arrivals, sample)

    def _read_events(self, response, arrivals: list[int], sample: dict) -> str | None:
        while True:
            line = response.readline()
            now = time.perf_counter_ns()
            if not line:
                return "the stream ended without [DONE]"
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                expected = MAX_TOKENS[self.kind]
                return None if len(arrivals) == expected else f"{len(arrivals)} tokens, wanted {expected}"
            event = json.loads(payload)
            if "error" in event:
                return f"error event: {event['error']}"
            if event.get("choices"):
                arrivals.append(now)  # one event per token
            if event.get("usage"):
                sample["prompt_tokens"] = [event["usage"]["prompt_tokens"]]

    def _record(self, sent: int, arrivals: list[int], sample: dict) -> None:
        sample["ttft_ns"] = [arrivals[0] - sent] if arrivals else []
        sample["gaps_ns"] = [b - a for a, b in zip(arrivals, arrivals[1:])]
        SAMPLES.add(self.kind, sample)
        failed = sample.get("failed")
        self.environment.events.request.fire(
            request_type="SSE", name=f"{self.kind} stream", response_time=(time.perf_counter_ns() - sent) / 1e6,
            response_length=len(sample["gaps_ns"]), exception=RuntimeError(failed) if failed else None,
            context={})


class SpeculativeUser(StreamingUser):
    kind = "spec"
    fixed_count = 1


class ClassicUser(StreamingUser):
    kind = "classic"
    fixed_count = 1


# -- arguments, own server, sample transport ---------------------------------------
@events.init_command_line_parser.add_listener
def _arguments(parser) -> None:
    parser.add_argument("--report-json", default=str(DEFAULT_REPORT), help="where the JSON report goes")
    parser.add_argument("--bound-ms", type=float, default=None,
                        help="b = decode step + one round, ms (default: from the server's /health costs)")
    parser.add_argument("--slice0-ms", type=float, default=None,
                        help="slice 0 of the speculative request, ms (default: from /health costs)")


@events.init.add_listener
def _on_init(environment, runner, **_) -> None:
    if isinstance(runner, WorkerRunner):  # workers get the host from the master's spawn message
        return
    if not environment.host:
        environment.host = start_mock_server(Path(environment.parsed_options.report_json))
    health = get_json(environment.host, "/health")
    models = get_json(environment.host, "/v1/models") or {}
    STATE["model"] = next((m.get("id") for m in models.get("data", [])), None)
    STATE["costs"] = (health or {}).get("costs")
    STATE["mode"] = (health or {}).get("mode")
    warm_up(environment.host)


def warm_up(base: str) -> None:
    """One short request per kind before the clock starts: cold paths are not what we measure."""
    for kind in KINDS:
        body = {"prompt": PROMPTS[kind], "max_tokens": 8, "temperature": 0, "speculative": kind == "spec"}
        if STATE.get("model"):
            body["model"] = STATE["model"]
        url = urllib.parse.urlsplit(base)
        conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=60)
        try:
            conn.request("POST", url.path.rstrip("/") + "/v1/completions", json.dumps(body),
                         {"Content-Type": "application/json"})
            conn.getresponse().read()
        except OSError:
            pass  # the run itself will report an unreachable server
        finally:
            conn.close()


@events.report_to_master.add_listener
def _send_samples(client_id, data) -> None:
    data["coopsched_samples"] = SAMPLES.take_pending()


@events.worker_report.add_listener
def _receive_samples(client_id, data) -> None:
    if "coopsched_samples" in data:
        SAMPLES.merge(client_id, data["coopsched_samples"])


@events.quitting.add_listener
def _on_quit(environment, **_) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return
    try:
        report = judge(SAMPLES, environment.parsed_options, STATE.get("costs"))
        report["mode"] = STATE.get("mode")
        report["distributed"] = isinstance(environment.runner, MasterRunner)
        report["workers"] = SAMPLES.by_worker
        report["locust_failures"] = environment.stats.total.num_failures
        # locust's own stats carry each request's gap count (response_length) by a separate path
        report["locust_reported_gaps"] = {k: environment.stats.get(f"{k} stream", "SSE").total_content_length
                                          for k in KINDS}
        report["ok"] = report["ok"] and report["locust_failures"] == 0
        path = Path(environment.parsed_options.report_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1) + "\n")
        print_table(report, path)
        environment.process_exit_code = 0 if report["ok"] else 1
    finally:
        stop_mock_server()


# -- judging -------------------------------------------------------------------------
def judge(samples: Samples, options, costs: dict | None) -> dict:
    ms = {kind: {"ttft": np.asarray(samples.data[kind]["ttft_ns"], dtype=np.int64) / 1e6,
                 "gaps": np.asarray(samples.data[kind]["gaps_ns"], dtype=np.int64) / 1e6} for kind in KINDS}
    pct = lambda a, q: float(np.percentile(a, q)) if a.size else None  # noqa: E731
    bound, slice0 = options.bound_ms, options.slice0_ms
    if costs:
        prompt = max(samples.data["spec"]["prompt_tokens"], default=len(PROMPTS["spec"].encode()))
        bound = bound if bound is not None else costs["decode_ms"] + costs["round_ms"]
        slice0 = slice0 if slice0 is not None else costs["slice0_fixed_ms"] + costs["slice0_per_token_ms"] * prompt
    classic = ms["classic"]["gaps"]
    failures = sum(samples.data[k]["failures"] for k in KINDS)
    report = {
        "bound_ms": bound, "slice0_ms": slice0,
        "classic_itl_p50_ms": pct(classic, 50), "classic_itl_p99_ms": pct(classic, 99),
        "classic_itl_max_ms": float(classic.max()) if classic.size else None,
        "classic_ttft_p50_ms": pct(ms["classic"]["ttft"], 50),
        "spec_ttft_p50_ms": pct(ms["spec"]["ttft"], 50), "spec_ttft_p95_ms": pct(ms["spec"]["ttft"], 95),
        "spec_itl_p50_ms": pct(ms["spec"]["gaps"], 50), "spec_itl_p99_ms": pct(ms["spec"]["gaps"], 99),
        "samples": {k: int(ms[k]["gaps"].size) for k in KINDS},
        "requests": {k: samples.data[k]["requests"] for k in KINDS},
        "failures": failures,
    }
    if bound is None or slice0 is None:
        report.update(ok=False, rule="no bound: the server reports no costs; pass --bound-ms and --slice0-ms")
        return report
    p99_limit = REAL_TIME_ALLOWANCE * bound + 5.0
    gap_limit = REAL_TIME_ALLOWANCE * (bound + slice0) + 10.0
    enough = classic.size > 0 and ms["spec"]["ttft"].size > 0
    report.update(
        p99_limit_ms=p99_limit, gap_limit_ms=gap_limit,
        rule=f"classic ITL p99 <= 1.5 x {bound:.1f} + 5 = {p99_limit:.1f} ms and every classic gap <= "
             f"1.5 x ({bound:.1f} + {slice0:.1f}) + 10 = {gap_limit:.1f} ms",
        ok=bool(enough and report["classic_itl_p99_ms"] <= p99_limit
                and report["classic_itl_max_ms"] <= gap_limit and failures == 0))
    return report


def print_table(report: dict, path: Path) -> None:
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    rows = [("bound b (decode + round)", report["bound_ms"]), ("classic ITL p50", report["classic_itl_p50_ms"]),
            ("classic ITL p99", report["classic_itl_p99_ms"]), ("  limit", report.get("p99_limit_ms")),
            ("classic ITL max", report["classic_itl_max_ms"]), ("  limit", report.get("gap_limit_ms")),
            ("spec TTFT p95", report["spec_ttft_p95_ms"]), ("spec ITL p99", report["spec_itl_p99_ms"])]
    print(f"\nconcurrency2 ({report.get('mode')} mode) - exact percentiles from raw samples, ms")
    for name, value in rows:
        print(f"  {name:<26}{fmt(value):>10}")
    print(f"  samples (gaps) {report['samples']}  requests {report['requests']}  failures {report['failures']}"
          f"  locust failures {report.get('locust_failures')}")
    print(f"  rule: {report['rule']}")
    print(f"  verdict: {'PASS' if report['ok'] else 'FAIL'}   report: {path}\n", flush=True)


# -- the mock server this file starts when no --host is given --------------------------
def start_mock_server(report_path: Path) -> str:
    log_path = report_path.with_suffix(".server.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")  # noqa: SIM115 - kept open for the server's lifetime
    proc = subprocess.Popen([sys.executable, "-m", "coopsched.cli", "serve", "--port", "0", *MOCK_ARGS],
                            stdout=subprocess.DEVNULL, stderr=log, env=dict(os.environ))
    STATE["server"] = proc
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        match = re.search(r"listening on (http://[\d.]+:\d+)", log_path.read_text())
        if match and get_json(match.group(1), "/health") is not None:
            return match.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"the mock server exited ({proc.returncode}): {log_path.read_text()}")
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the mock server did not come up within 60 s; see {log_path}")


def stop_mock_server() -> None:
    proc = STATE.pop("server", None)
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def get_json(base: str, path: str) -> dict | None:
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=5)
    try:
        conn.request("GET", url.path.rstrip("/") + path)
        response = conn.getresponse()
        return json.loads(response.read()) if response.status == 200 else None
    except (OSError, ValueError):
        return None
    finally:
        conn.close()
