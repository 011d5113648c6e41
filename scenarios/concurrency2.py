"""Locust: one speculative and one classic streaming user; exact TTFT/ITL percentiles against the bound.

    locust -f scenarios/concurrency2.py --headless        # 1 + 1 users for 20 s, its own mock server
    locust -f scenarios/concurrency2.py --headless -t 5s --host URL --report-json PATH

Defaults (-u 2 -r 2 -t 20s) are parser defaults set here, so -u/-r/-t, LOCUST_* variables
and a locust.conf still win; the web UI starts with them too and stops after the run time.
Every token's arrival is kept raw (perf_counter_ns) and counted by the shared rule
(harness/live/client.py: token ids, else the final usage; a multi-token event is one
arrival of n tokens with zero gaps inside it). The bound b = decode step + one round
(from the server's /health costs, or --bound-ms with --slice0-ms): pass iff classic ITL
p99 <= 1.5 b + 5 ms and every classic gap <= 1.5 (b + slice 0) + 10 ms. A server that
reports no costs is calibrated first: each kind streams alone 3 times, then TTFT and every gap
of every request must stay within 3 x the worst solo figure + 25 ms (the rule of `--target`).
A wait over a limit fails the run only if the stall rule (harness/live/stalls.py) charges it.
No samples of a kind: neither pass nor fail (`ok` null, `missing` names the kind, exit 2),
unless requests failed: failed requests fail the run, samples or not.
With no --host a mock server (--decode-ms 5 --round-ms 30) runs on a free loopback port.
Workers send their raw samples to the master with each stats report. Exit status: 0 pass,
1 fail (bound or failed requests), 2 a kind without samples.
"""

from __future__ import annotations

import itertools
import json
import time
from contextlib import ExitStack
from pathlib import Path

import gevent
import numpy as np
from locust import User, constant, events, task
from locust.runners import LocalRunner, MasterRunner, WorkerRunner

from harness.live import client, solo, stalls
from harness.run import metrics

KINDS = ("classic", "spec")
FAILURE_PAUSE_S = 0.25  # a user whose request failed waits this long before its next one
# short prompts: slice 0 stays small, so admissions (slice 0 + round 1) do not dominate the p99
PROMPTS = {"classic": "The classic row.", "spec": "Speculate, then verify."}
MAX_TOKENS = {"classic": 128, "spec": 64}
MOCK_ARGS = ("--decode-ms", "5", "--round-ms", "30")
DEFAULT_REPORT = Path("reports/locust/concurrency2.json")
DEFAULT_USERS, DEFAULT_RUN_TIME_S = 2, 20
REAL_TIME_ALLOWANCE = 1.5
DEFAULT_BLOCK_SIZE = 4  # K when /health does not say: one round streams at most K tokens
ORIGIN_NS = time.perf_counter_ns()  # per-request times in the report are ms after this
SEQ = itertools.count()


def request_body(kind: str) -> dict:
    body = {"prompt": PROMPTS[kind], "max_tokens": MAX_TOKENS[kind], "temperature": 0,
            "stream_options": {"include_usage": True}, "speculative": kind == "spec", "return_token_ids": True,
            "return_tick_times": True}
    if STATE.get("model"):
        body["model"] = STATE["model"]
    return body


class Samples:
    """Raw per-kind samples in ns and per-request timings; `pending` is what a worker has not yet
    sent to the master."""

    LISTS = ("ttft_ns", "gaps_ns", "prompt_tokens")

    def __init__(self) -> None:
        self.data = self._empty()
        self.pending = self._empty()
        self.by_worker: dict[str, dict[str, int]] = {}

    @staticmethod
    def _empty() -> dict:
        kinds = {kind: {"ttft_ns": [], "gaps_ns": [], "requests": 0, "failures": 0, "prompt_tokens": [],
                        "events": 0, "tokens": 0} for kind in KINDS}
        return {**kinds, "per_request": [], "streams": []}

    def add(self, kind: str, sample: dict) -> None:
        for store in (self.data, self.pending):
            for key in self.LISTS:
                store[kind][key] += sample.get(key, [])
            store[kind]["requests"] += 1
            store[kind]["failures"] += int(bool(sample.get("failed")))
            store[kind]["events"] += sample["events"]
            store[kind]["tokens"] += sample["tokens"]
            store["per_request"].append(sample["request"])
            store["streams"].append(sample["stream"])

    def take_pending(self) -> dict:
        pending, self.pending = self.pending, self._empty()
        return pending

    def merge(self, client_id: str, part: dict) -> None:
        counts = self.by_worker.setdefault(client_id, {kind: 0 for kind in KINDS})
        for kind in KINDS:
            for key in self.LISTS:
                self.data[kind][key] += part[kind][key]
            for key in ("requests", "failures", "events", "tokens"):
                self.data[kind][key] += part[kind][key]
            counts[kind] += len(part[kind]["gaps_ns"])
        self.data["per_request"] += [{**r, "id": f"{client_id}/{r['id']}", "worker": client_id}
                                     for r in part["per_request"]]
        self.data["streams"] += [{**st, "id": f"{client_id}/{st['id']}"} for st in part["streams"]]


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
            for arrival in client.stream(self.environment.host, request_body(self.kind), timeout_s=120):
                got.arrivals.append(arrival)
                # let the other users read too: a reader whose socket always has data never yields under
                # gevent, and the other stream's arrivals would be stamped late (a false run-ahead)
                gevent.sleep(0)
            failed = count_problem(self.kind, got)
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
        counts = got.counts
        times = metrics.token_times([a.time_ns for a in got.arrivals], counts)
        gaps = [int(g) for g in metrics.token_gaps([a.time_ns for a in got.arrivals], counts)]
        usage = got.usage or {}
        request_id = f"{self.kind}-{next(SEQ)}"
        stream = stalls.Stream.of(request_id, self.kind, got)
        sample = {"ttft_ns": [times[0] - got.sent_ns] if times else [], "gaps_ns": gaps, "failed": failed,
                  "prompt_tokens": [usage["prompt_tokens"]] if "prompt_tokens" in usage else [],
                  "events": sum(n > 0 for n in counts), "tokens": len(times),
                  "stream": stream.to_json(),
                  "request": {"id": request_id, "kind": self.kind,
                              "arrival_ms": round((got.sent_ns - ORIGIN_NS) / 1e6, 3),
                              "token_times_ms": [round((t - ORIGIN_NS) / 1e6, 3) for t in times],
                              "tick_end_ms": None if stream.ticks_ns is None else
                              [round((t - ORIGIN_NS) / 1e6, 3) for t in stream.ticks_ns],
                              "finish_reason": got.finish_reason, "error": failed, "cut_by_stop": cut}}
        SAMPLES.add(self.kind, sample)
        self.environment.events.request.fire(
            request_type="SSE", name=f"{self.kind} stream", response_time=(time.perf_counter_ns() - got.sent_ns) / 1e6,
            response_length=len(gaps), exception=RuntimeError(failed) if failed else None, context={})


def count_problem(kind: str, got: client.Collected) -> str | None:
    """Why a finished stream's token count is wrong, if it is (tokens counted as in client.token_counts)."""
    num_tokens, usage = sum(got.counts), got.usage or {}
    has_ids = all(a.n_tokens is not None for a in got.arrivals)
    if not has_ids and "completion_tokens" not in usage:
        return (f"{len(got.arrivals)} text-only events and no usage: the server ignored return_token_ids and "
                f"stream_options.include_usage, so its tokens cannot be counted")
    if has_ids and usage.get("completion_tokens", num_tokens) != num_tokens:
        return f"{num_tokens} token ids streamed, usage says {usage['completion_tokens']}"
    if got.finish_reason is None:
        return "no finish_reason"
    if got.finish_reason == "length" and num_tokens != MAX_TOKENS[kind]:
        return f"{num_tokens} tokens, wanted {MAX_TOKENS[kind]}"
    return None


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
    warm_up(environment.host)
    if STATE["costs"] is None and (options.bound_ms is None or options.slice0_ms is None):
        # no costs to build the bound from: learn each kind's figures alone, as `--target` does
        STATE["solo"] = {kind: solo.measure(environment.host, request_body(kind), timeout_s=120) for kind in KINDS}


def warm_up(base: str) -> None:
    """One short request per kind before the clock starts: cold paths are not what we measure."""
    for kind in KINDS:
        body = {"prompt": PROMPTS[kind], "max_tokens": 8, "temperature": 0, "speculative": kind == "spec"}
        try:
            client.request(base, "POST", "/v1/completions", body | ({"model": STATE["model"]} if STATE["model"]
                                                                     else {}), timeout_s=60)
        except OSError:
            pass  # the run itself will report an unreachable server


@events.test_start.add_listener
def _on_test_start(environment, **_) -> None:
    global SAMPLES
    SAMPLES = Samples()  # a web UI may start several runs: each is judged on its own samples
    STATE.update(report=None, started=time.monotonic())


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
    report = judge(SAMPLES, options, STATE.get("costs"), STATE.get("solo"), STATE.get("block_size"))
    report.update(mode=STATE.get("mode"), distributed=isinstance(environment.runner, MasterRunner),
                  workers=SAMPLES.by_worker, users=options.num_users, run_time_s=options.run_time,
                  duration_s=round(time.monotonic() - STATE.get("started", time.monotonic()), 3),
                  locust_failures=environment.stats.total.num_failures)
    # locust's own stats carry each request's gap count (response_length) by a separate path
    report["locust_reported_gaps"] = {k: environment.stats.get(f"{k} stream", "SSE").total_content_length
                                      for k in KINDS}
    if report["locust_failures"]:  # a failed request fails the run, whatever the samples say
        report["ok"] = False
        if report.get("missing"):
            first = next((r["error"] for r in SAMPLES.data["per_request"] if r.get("error")), "see locust's stats")
            report["rule"] = (f"{report['locust_failures']} request(s) failed (the first: {first}); "
                              "no verdict on latency")
    report["verdict"] = {True: "pass", False: "fail", None: "no samples"}[report["ok"]]
    report["per_request"] = SAMPLES.data["per_request"]
    path = Path(options.report_json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    print_table(report, path)
    STATE["report"] = report
    return report


# -- judging -------------------------------------------------------------------------
def judge(samples: Samples, options, costs: dict | None, solo_figures: dict | None = None,
          block_size: int | None = None) -> dict:
    ms = {kind: {"ttft": np.asarray(samples.data[kind]["ttft_ns"], dtype=np.int64) / 1e6,
                 "gaps": np.asarray(samples.data[kind]["gaps_ns"], dtype=np.int64) / 1e6} for kind in KINDS}
    pct = lambda a, q: float(np.percentile(a, q)) if a.size else None
    top = lambda a: float(a.max()) if a.size else None
    classic = ms["classic"]["gaps"]
    failures = sum(samples.data[k]["failures"] for k in KINDS)
    report = {
        "bound_ms": None, "slice0_ms": None,
        "classic_itl_p50_ms": pct(classic, 50), "classic_itl_p99_ms": pct(classic, 99),
        "classic_itl_max_ms": top(classic),
        "classic_ttft_p50_ms": pct(ms["classic"]["ttft"], 50),
        "spec_ttft_p50_ms": pct(ms["spec"]["ttft"], 50), "spec_ttft_p95_ms": pct(ms["spec"]["ttft"], 95),
        "spec_itl_p50_ms": pct(ms["spec"]["gaps"], 50), "spec_itl_p99_ms": pct(ms["spec"]["gaps"], 99),
        "samples": {k: int(ms[k]["gaps"].size) for k in KINDS},
        "requests": {k: samples.data[k]["requests"] for k in KINDS},
        "events": {k: samples.data[k]["events"] for k in KINDS},
        "tokens": {k: samples.data[k]["tokens"] for k in KINDS},
        "failures": failures,
    }
    missing = [k for k in KINDS if not ms[k]["gaps"].size]
    if missing:
        report.update(ok=None, missing=missing, calibration=None,
                      rule=f"no token gaps of {' and '.join(missing)}: nothing to judge "
                           f"(neither pass nor fail)")
        return report
    streams = [stalls.Stream.from_json(d) for d in samples.data["streams"]]
    if costs is None and (options.bound_ms is None or options.slice0_ms is None):
        return report | solo_verdict(ms, solo_figures or {}, failures, streams)
    bound, slice0 = options.bound_ms, options.slice0_ms
    if costs:
        prompt = max(samples.data["spec"]["prompt_tokens"], default=len(PROMPTS["spec"].encode()))
        bound = bound if bound is not None else costs["decode_ms"] + costs["round_ms"]
        slice0 = slice0 if slice0 is not None else costs["slice0_fixed_ms"] + costs["slice0_per_token_ms"] * prompt
    p99_limit = REAL_TIME_ALLOWANCE * bound + 5.0
    gap_limit = REAL_TIME_ALLOWANCE * (bound + slice0) + 10.0
    # a gap over a limit counts against the server only if a stream ran ahead in it
    rule = stalls.Rule(tokens_per_round=block_size or DEFAULT_BLOCK_SIZE)
    classic_streams = [st for st in streams if st.kind == "classic"]
    every = [w for st in classic_streams for w in stalls.waits_of(st, gap_limit)]
    line = stalls.judge(every, streams, rule)
    tail = [w for st in classic_streams for w in stalls.waits_of(st, p99_limit)]
    stalls.judge(tail, streams, rule)
    charged_p99 = stalls.charged_percentile(tail, 99)
    charged_max = max((w.charged_ms for w in every), default=0.0)
    summary = stalls.summarize(every, line, rule)
    report.update(
        bound_ms=bound, slice0_ms=slice0, calibration="costs" if costs else "bound-ms",
        p99_limit_ms=p99_limit, gap_limit_ms=gap_limit,
        classic_itl_p99_charged_ms=charged_p99, classic_itl_max_charged_ms=charged_max,
        margin=summary.worst_ratio, stalls={"every_gap": summary.to_json(),
                                            "p99": stalls.summarize(tail, line, rule).to_json()},
        rule=f"classic ITL p99 <= 1.5 x {bound:.1f} + 5 = {p99_limit:.1f} ms and every classic gap <= "
             f"1.5 x ({bound:.1f} + {slice0:.1f}) + 10 = {gap_limit:.1f} ms, where {summary.rule}",
        ok=bool(charged_p99 <= p99_limit and summary.num_hol == 0 and failures == 0))
    return report


def solo_verdict(ms: dict, figures: dict, failures: int, streams: list) -> dict:
    """No costs: every request's TTFT and every gap of a kind within the solo rule of its kind, a wait
    over it charged to the server only if a stream ran ahead in it."""
    out = {"calibration": "solo", "solo": {k: f.to_json() for k, f in figures.items()}}
    broken = [k for k in KINDS if k not in figures or figures[k].ttft_ms is None]
    if broken:
        return out | {"ok": False, "rule": f"the solo run of {', '.join(broken)} streamed no token"}
    limits = {k: {"ttft_limit_ms": solo.solo_limit(figures[k].ttft_ms),
                  "gap_limit_ms": solo.solo_limit(figures[k].stall_ms)} for k in KINDS}
    worst = {k: {"ttft_max_ms": float(ms[k]["ttft"].max()) if ms[k]["ttft"].size else None,
                 "gap_max_ms": float(ms[k]["gaps"].max())} for k in KINDS}
    rule = stalls.Rule(tokens_per_round=max(figures[k].max_tokens_per_event for k in KINDS),
                       pace_ms=min((figures[k].pace_ms for k in KINDS if figures[k].pace_ms), default=None))
    waits = [w for st in streams
             for w in stalls.waits_of(st, limits[st.kind]["gap_limit_ms"], limits[st.kind]["ttft_limit_ms"])]
    line = stalls.judge(waits, streams, rule)
    summary = stalls.summarize(waits, line, rule)
    rule_text = "; ".join(f"{k}: TTFT max {worst[k]['ttft_max_ms']:.1f} <= {limits[k]['ttft_limit_ms']:.1f}, gap max "
                          f"{worst[k]['gap_max_ms']:.1f} <= {limits[k]['gap_limit_ms']:.1f}" for k in KINDS)
    return out | {"solo_limits": limits, "gap_limit_ms": limits["classic"]["gap_limit_ms"],
                  "margin": summary.worst_ratio, "stalls": {"waits": summary.to_json()},
                  "ok": bool(summary.num_hol == 0 and failures == 0),
                  "rule": f"the server reports no costs, each kind ran alone first; {solo.RULE} ({rule_text}), "
                          f"where {summary.rule}"}


def print_table(report: dict, path: Path) -> None:
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    rows = [("bound b (decode + round)", report["bound_ms"]), ("classic ITL p50", report["classic_itl_p50_ms"]),
            ("classic ITL p99", report["classic_itl_p99_ms"]), ("  limit", report.get("p99_limit_ms")),
            ("  charged (noise at limit)", report.get("classic_itl_p99_charged_ms")),
            ("classic ITL max", report["classic_itl_max_ms"]), ("  limit", report.get("gap_limit_ms")),
            ("  charged (noise at limit)", report.get("classic_itl_max_charged_ms")),
            ("spec TTFT p95", report["spec_ttft_p95_ms"]), ("spec ITL p99", report["spec_itl_p99_ms"])]
    mode = f"{report['mode']} mode" if report.get("mode") else "the server names no mode"
    print(f"\nconcurrency2 ({mode}) - exact percentiles from raw samples, ms")
    for name, value in rows:
        print(f"  {name:<26}{fmt(value):>10}")
    print(f"  samples (gaps) {report['samples']}  tokens {report['tokens']} in events {report['events']}")
    print(f"  requests {report['requests']}  failures {report['failures']}  locust failures "
          f"{report.get('locust_failures')}  users {report.get('users')}  run time {report.get('run_time_s')} s")
    for name, st in (report.get("stalls") or {}).items():
        worst = st["worst_hol"] or st["worst_noise"]
        print(f"  {name}: {st['over_limit']} of {st['waits']} waits over the limit: {st['hol']} head-of-line "
              f"(a stream ran ahead), {st['noise']} noise; worst wait / limit {st['worst_over_limit']}; most "
              f"tokens one stream got in one wait {st['max_evidence_tokens']}"
              + (f"; worst over: {worst['ms']:.1f} ms, {worst['evidence_tokens']} tokens of {worst['by']} "
                 f"(allowed {worst['allowance_tokens']})" if worst else ""))
    print(f"  rule: {report['rule']}")
    print(f"  verdict: {report['verdict'].upper()}   report: {path}\n", flush=True)
