"""Prometheus metrics for `/metrics`: the scheduler's BatchObservability, promoted.

Every committed tick hands over its counter deltas, HOL waits and finished
requests' BurstFinalized records (on their finish events); the server never reads
or trims the scheduler's books. TTFT and ITL come from token event times. Updates
run on the engine worker thread; the three gauges are read at scrape time (plain
length reads of the worker's containers).
"""

from __future__ import annotations

import json
import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from coopsched.core import Committed

from .protocol import spec_counts

# seconds; the first bucket is 1 ms so sub-round gaps stay visible
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_KINDS = ("classic", "spec")
burst_log = logging.getLogger("coopsched.burst")


class Metrics:
    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry()
        self.spec_rounds = Counter("coopsched_spec_rounds_total", "Speculative rounds executed",
                                   registry=registry)
        self.spec_draft_tokens = Counter("coopsched_spec_draft_tokens_total", "Draft tokens proposed",
                                         registry=registry)
        self.spec_accepted_tokens = Counter("coopsched_spec_accepted_tokens_total",
                                            "Draft tokens accepted by the target", registry=registry)
        self.spec_slices = Counter("coopsched_spec_slices_total",
                                   "Ticks in which a speculative job did model work (slice 0 included)",
                                   registry=registry)
        self.burst_wall = Histogram("coopsched_burst_wall_seconds",
                                    "Longest single tick each speculative request occupied (its HOL stall)",
                                    buckets=LATENCY_BUCKETS, registry=registry)
        self.hol_wait = Histogram("coopsched_hol_wait_seconds",
                                  "Time a classic row with pending work waited on speculative actions",
                                  buckets=LATENCY_BUCKETS, registry=registry)
        self.hol_waiters_max = Gauge("coopsched_hol_waiters_max",
                                     "Most classic rows and queued requests waiting on one speculative tick",
                                     registry=registry)
        self.ttft = Histogram("coopsched_time_to_first_token_seconds",
                              "Request received -> first token visible", buckets=LATENCY_BUCKETS,
                              registry=registry)
        self.itl = Histogram("coopsched_inter_token_latency_seconds",
                             "Gap between consecutive tokens of one request (0 within one round)",
                             ["kind"], buckets=LATENCY_BUCKETS, registry=registry)
        self.running = Gauge("coopsched_requests_running",
                             "Requests generating: classic batch rows and active speculative rows",
                             registry=registry)
        self.waiting = Gauge("coopsched_requests_waiting",
                             "Requests waiting: prefill queue and speculative backlog", registry=registry)
        self.kv_slots = Gauge("coopsched_kv_slots_in_use", "KV slots held", registry=registry)
        # llama.cpp's names, counted as upstream counts them: one draft per round, K draft tokens
        # per round, and per round the tokens it emitted minus one (booked when a request finishes)
        self.llama_drafts = Counter("llamacpp:spec_decode_num_drafts", "Speculative: verification steps "
                                    "(one per round)", registry=registry)
        self.llama_draft_tokens = Counter("llamacpp:spec_decode_num_draft_tokens", "Speculative: draft tokens "
                                          "(K per round)", registry=registry)
        self.llama_accepted = Counter("llamacpp:spec_decode_num_accepted_tokens", "Speculative: draft tokens "
                                      "accepted (tokens a round emitted minus one)", registry=registry)
        self.prefill_grants = Counter("coopsched_prefill_grants", "Chunks granted to a chunked prompt beside decode "
                                      "rows (slice, burst: after prefill_grant_interval decode ticks)",
                                      registry=registry)
        self.mixed_steps = Counter("coopsched_mixed_steps", "Mixed steps: a chunk and the decode rows in one forward",
                                   registry=registry)
        # the engine's own step books: what each tick did, over how many rows, and its wall time (a
        # twin's tick prices are checked against these, free of the HTTP layer's delivery)
        self.ticks = Counter("coopsched_ticks", "Engine ticks committed, by what the tick did and its rows",
                             ["kind", "rows"], registry=registry)
        self.tick_seconds = Counter("coopsched_tick_seconds", "Wall time of the engine's committed ticks, "
                                    "by kind and rows", ["kind", "rows"], registry=registry)
        for kind in ITL_KINDS:  # export both series from the start
            self.itl.labels(kind=kind)
        self._hol_waiters_max = 0

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe_tokens(self, kind: str, ttft_ms: float | None, gaps_ms: list[float]) -> None:
        if ttft_ms is not None:
            self.ttft.observe(max(ttft_ms, 0.0) / 1e3)
        series = self.itl.labels(kind=kind)
        for gap in gaps_ms:
            series.observe(gap / 1e3)

    def record_tick(self, committed: Committed) -> None:
        """One committed tick: its counter deltas, HOL waits, and the finished requests' records."""
        deltas, record = committed.deltas, committed.record
        labels = {"kind": record.kind.value, "rows": str(len(record.request_ids))}
        self.ticks.labels(**labels).inc()
        self.tick_seconds.labels(**labels).inc(max(record.end_ms - record.start_ms, 0.0) / 1e3)
        for counter, delta in ((self.spec_rounds, deltas.rounds), (self.spec_draft_tokens, deltas.drafted),
                               (self.spec_accepted_tokens, deltas.accepted), (self.spec_slices, deltas.slices),
                               (self.prefill_grants, deltas.prefill_grants), (self.mixed_steps, deltas.mixed_steps)):
            if delta:
                counter.inc(delta)
        for wait, count in deltas.hol_waits:
            for _ in range(count):  # a histogram observes one sample at a time
                self.hol_wait.observe(wait / 1e3)
        if deltas.hol_waiters > self._hol_waiters_max:
            self._hol_waiters_max = deltas.hol_waiters
            self.hol_waiters_max.set(deltas.hol_waiters)
        if deltas.rounds:
            self.llama_drafts.inc(deltas.rounds)
            self.llama_draft_tokens.inc(deltas.drafted + deltas.rounds)
        for event in committed.events:
            burst = event.outcome.burst if event.outcome is not None else None
            if burst is not None:
                accepted = spec_counts(burst.to_json())[2]
                if accepted:
                    self.llama_accepted.inc(accepted)
                self.burst_wall.observe(burst.burst_wall_ms / 1e3)
                burst_log.info(json.dumps({"event": "BurstFinalized", **burst.to_json()}))

    def watch_engine(self, engine) -> None:
        """The worker's busy time, read at scrape time: beside the ticks' own, what the steps cost
        outside their model calls (planning, commit, deliveries)."""
        self.registry.register(_Busy(engine))

    def watch(self, scheduler) -> None:
        """The gauges read the scheduler at scrape time, so a long tick (a prefill, a burst) shows."""
        def running() -> int:
            job = scheduler.job
            return len(scheduler.running) + (len(job.live_rows) if job is not None else 0)

        self.running.set_function(running)
        self.waiting.set_function(
            lambda: len(scheduler.queue) + sum(len(j.rows) for j in list(scheduler.backlog)))
        self.kv_slots.set_function(lambda: scheduler.kv.num_in_use)


class _Busy(Collector):
    def __init__(self, engine) -> None:
        self.engine = engine

    def collect(self):
        yield CounterMetricFamily("coopsched_engine_busy_seconds", "The engine worker's time in its steps "
                                  "(plan, model call, commit, deliveries), idle waits left out",
                                  value=self.engine.busy_ms / 1e3)
