"""Locust: one speculative and one classic streaming user, judged against the bound when the run ends.

    locust -f scenarios/concurrency2.py --headless        # 1 + 1 users for 20 s, its own mock server
    locust -f scenarios/concurrency2.py --headless -t 5s --host URL --report-json PATH

This file holds what locust needs: the users, the run's shape (-u 2 -r 2 -t 20s as parser
defaults, so -u/-r/-t, LOCUST_* variables and a locust.conf still win) and the report. Each
stream is kept raw (harness/live/samples.py) and judged by harness/verdict/live.py: the bound
b = decode step + one round from /health's costs (or --bound-ms with --slice0-ms), else each
kind's solo runs; a wait over its limit fails only if the stall rule charges it. With no --host
a mock server (--decode-ms 5 --round-ms 30) runs on a free loopback port. Exit: 0 pass, 1 fail
(a bound or failed requests), 2 a kind without samples (a skipped check is never a pass).
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path

import gevent
from locust import User, constant, events, task
from locust.runners import LocalRunner, MasterRunner, WorkerRunner

from harness.live import client, samples, solo
from harness.live.samples import KINDS, Samples
from harness.verdict.live import locust_verdict, with_locust_failures

FAILURE_PAUSE_S = 0.25  # a user whose request failed waits this long before its next one
MOCK_ARGS = ("--decode-ms", "5", "--round-ms", "30")
DEFAULT_REPORT = Path("reports/locust/concurrency2.json")
DEFAULT_USERS, DEFAULT_RUN_TIME_S = 2, 20

SAMPLES = Samples()
STATE: dict = {"costs": None, "mode": None, "solo": None, "report": None}


# -- the users -------------------------------------------------------------------
class StreamingUser(User):
    abstract = True
    kind = "classic"
    wait_time = constant(0)

    @task
    def stream(self) -> None:
        got = client.Collected(time.perf_counter_ns())
        failed, ended = None, False
        try:
            for arrival in client.stream(self.environment.host, samples.request_body(self.kind, STATE.get("model")),
                                         timeout_s=120):
                got.arrivals.append(arrival)
                # let the other users read too: a reader whose socket always has data never yields under
                # gevent, and the other stream's arrivals would be stamped late (a false run-ahead)
                gevent.sleep(0)
            failed = samples.count_problem(self.kind, got)
            ended = True
        except client.StreamError as exc:
            failed, ended = str(exc), True
        except Exception as exc:
            failed, ended = repr(exc), True
        finally:  # also on GreenletExit when the run ends: what arrived is still a valid sample
            self._record(got, failed, cut=not ended)
        if failed:  # a refused connection fails at once: pause rather than spin thousands of requests on it
            gevent.sleep(FAILURE_PAUSE_S)

    def _record(self, got: client.Collected, failed: str | None, cut: bool) -> None:
        sample = samples.sample_of(self.kind, got, failed, cut, STATE.get("stopping_ns"))
        SAMPLES.add(self.kind, sample)
        self.environment.events.request.fire(
            request_type="SSE", name=f"{self.kind} stream", response_time=(time.perf_counter_ns() - got.sent_ns) / 1e6,
            response_length=len(sample["gaps_ns"]), exception=RuntimeError(failed) if failed else None, context={})


class SpeculativeUser(StreamingUser):
    kind = "spec"
    fixed_count = 1


class ClassicUser(StreamingUser):
    kind = "classic"
    fixed_count = 1


# -- arguments, own server, calibration, sample transport ---------------------------------
@events.init_command_line_parser.add_listener
def _arguments(parser) -> None:
    parser.add_argument("--report-json", default=str(DEFAULT_REPORT), help="where the JSON report goes")
    parser.add_argument("--bound-ms", type=float, default=None,
                        help="b = decode step + one round, ms (default: from the server's /health costs)")
    parser.add_argument("--slice0-ms", type=float, default=None,
                        help="slice 0 of the speculative request, ms (default: from /health costs)")
    # one user of each kind for 20 s unless -u/-r/-t (or LOCUST_* variables, locust.conf) say otherwise
    parser.set_defaults(num_users=DEFAULT_USERS, spawn_rate=DEFAULT_USERS, run_time=DEFAULT_RUN_TIME_S)


@events.init.add_listener
def _on_init(environment, runner, **_) -> None:
    if isinstance(runner, WorkerRunner):  # workers get the host from the master's spawn message
        return
    options = environment.parsed_options
    STATE["stack"] = stack = ExitStack()
    if not environment.host:
        log = Path(options.report_json).with_suffix(".server.log")
        environment.host = stack.enter_context(client.spawn_server(MOCK_ARGS, log_path=log)).url
    health = client.get_json(environment.host, "/health") or {}
    models = client.get_json(environment.host, "/v1/models") or {}
    STATE["model"] = next((m.get("id") for m in models.get("data", [])), None)
    STATE["costs"] = health.get("costs") if isinstance(health.get("costs"), dict) else None
    STATE["mode"] = health.get("mode")
    STATE["block_size"] = health.get("block_size")
    samples.warm_up(environment.host, STATE["model"])
    if STATE["costs"] is None and (options.bound_ms is None or options.slice0_ms is None):
        # no costs to build the bound from: learn each kind's figures alone, as `--target` does
        STATE["solo"] = {kind: solo.measure(environment.host, samples.request_body(kind, STATE["model"]),
                                                timeout_s=120) for kind in KINDS}


@events.test_start.add_listener
def _on_test_start(environment, **_) -> None:
    global SAMPLES
    SAMPLES = Samples()  # a web UI may start several runs: each is judged on its own samples
    STATE.update(report=None, started=time.monotonic(), stopping_ns=None)


@events.test_stopping.add_listener
def _on_test_stopping(**_) -> None:
    STATE["stopping_ns"] = time.perf_counter_ns()


@events.report_to_master.add_listener
def _send_samples(client_id, data) -> None:
    data["coopsched_samples"] = SAMPLES.take_pending()


@events.worker_report.add_listener
def _receive_samples(client_id, data) -> None:
    if "coopsched_samples" in data:
        SAMPLES.merge(client_id, data["coopsched_samples"])


@events.test_stop.add_listener
def _on_test_stop(environment, **_) -> None:
    # a local run has every sample now (a web UI run then has its report without quitting);
    # a master gets the workers' last samples only when they quit
    if isinstance(environment.runner, LocalRunner):
        finish(environment)


@events.quitting.add_listener
def _on_quit(environment, **_) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return
    try:
        report = STATE["report"] or finish(environment)
        environment.process_exit_code = {True: 0, False: 1, None: 2}[report["ok"]]
    finally:
        STATE.pop("stack", ExitStack()).close()  # stops the mock server this file started


def finish(environment) -> dict:
    """Judge the samples, write the report, print the table."""
    options = environment.parsed_options
    report = locust_verdict(SAMPLES.data, STATE.get("costs"), bound_ms=options.bound_ms, slice0_ms=options.slice0_ms,
                            solo_figures=STATE.get("solo"), block_size=STATE.get("block_size"))
    report.update(mode=STATE.get("mode"), distributed=isinstance(environment.runner, MasterRunner),
                  workers=SAMPLES.by_worker, users=options.num_users, run_time_s=options.run_time,
                  duration_s=round(time.monotonic() - STATE.get("started", time.monotonic()), 3))
    # locust's own stats carry each request's gap count (response_length) by a separate path
    report["locust_reported_gaps"] = {k: environment.stats.get(f"{k} stream", "SSE").total_content_length
                                      for k in KINDS}
    report = with_locust_failures(report, environment.stats.total.num_failures, SAMPLES.data)
    report["verdict"] = {True: "pass", False: "fail", None: "no samples"}[report["ok"]]
    report["per_request"] = SAMPLES.data["per_request"]
    path = Path(options.report_json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    samples.print_table(report, path)
    STATE["report"] = report
    return report
