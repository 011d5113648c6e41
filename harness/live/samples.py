"""What the concurrency2 locust users stream and keep: request bodies, one sample per stream, the samples
merged across workers, and the printed table. Plain Python (no locust import): the locust file
(scenarios/concurrency2.py) runs the users, harness/verdict/live.py judges the samples.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from pathlib import Path

from harness.live import client, stalls
from harness.run import metrics

KINDS = ("classic", "spec")
# short prompts: slice 0 stays small, so admissions (slice 0 + round 1) do not dominate the p99
PROMPTS = {"classic": "The classic row.", "spec": "Speculate, then verify."}
MAX_TOKENS = {"classic": 128, "spec": 64}
ORIGIN_NS = time.perf_counter_ns()  # per-request times in the report are ms after this
SEQ = itertools.count()


def request_body(kind: str, model: str | None = None) -> dict:
    body = {"prompt": PROMPTS[kind], "max_tokens": MAX_TOKENS[kind], "temperature": 0,
            "stream_options": {"include_usage": True}, "speculative": kind == "spec", "return_token_ids": True,
            "return_tick_times": True}
    if model:
        body["model"] = model
    return body


def warm_up(base: str, model: str | None) -> None:
    """One short request per kind before the clock starts: cold paths are not what we measure."""
    for kind in KINDS:
        body = {"prompt": PROMPTS[kind], "max_tokens": 8, "temperature": 0, "speculative": kind == "spec"}
        try:
            client.request(base, "POST", "/v1/completions", body | ({"model": model} if model else {}), timeout_s=60)
        except OSError:
            pass  # the run itself will report an unreachable server


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


def sample_of(kind: str, got: client.Collected, failed: str | None, cut: bool, stopping_ns: int | None = None) -> dict:
    """One stream as a sample: raw ns TTFT and gaps, its counts, its stall-rule stream and its
    per-request record (ms after ORIGIN_NS, for `coopsched judge`). A stream the stop cut keeps what
    it read before the stop began (`stopping_ns`): locust holds every reader for 20-35 ms before it
    says it stops, then one stream reads its backlog and the others are killed before reading theirs,
    a lump the stall rule would charge to the server (docs/live-verdicts.md)."""
    if cut and stopping_ns is not None:
        got = dataclasses.replace(got, arrivals=[a for a in got.arrivals if a.time_ns <= stopping_ns])
    counts = got.counts
    times = metrics.token_times([a.time_ns for a in got.arrivals], counts)
    gaps = [int(g) for g in metrics.token_gaps([a.time_ns for a in got.arrivals], counts)]
    usage = got.usage or {}
    request_id = f"{kind}-{next(SEQ)}"
    stream = stalls.Stream.of(request_id, kind, got)
    ms = lambda ns: round((ns - ORIGIN_NS) / 1e6, 3)
    return {"ttft_ns": [times[0] - got.sent_ns] if times else [], "gaps_ns": gaps, "failed": failed,
            "prompt_tokens": [usage["prompt_tokens"]] if "prompt_tokens" in usage else [],
            "events": sum(n > 0 for n in counts), "tokens": len(times), "stream": stream.to_json(),
            "request": {"id": request_id, "kind": kind, "arrival_ms": ms(got.sent_ns),
                        "token_times_ms": [ms(t) for t in times],
                        "tick_end_ms": None if stream.ticks_ns is None else [ms(t) for t in stream.ticks_ns],
                        "finish_reason": got.finish_reason, "error": failed, "cut_by_stop": cut}}


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
    for c in report.get("checks", []):
        verdict = "skipped" if c.get("skipped") else ("ok" if c["ok"] else "FAIL")
        print(f"  check {c['name']}: {verdict} ({c['note']})")
    print(f"  rule: {report['rule']}")
    print(f"  verdict: {report['verdict'].upper()}   report: {path}\n", flush=True)
