"""`coopsched run NAME --target URL`: a scenario against any OpenAI-compatible server, in real time.

Each request streams from its own thread at its arrival offset; token arrival
times are raw perf_counter_ns. The checks cover every request's TTFT as well
as the classic ITL: a server that serves requests one at a time shows its
head-of-line block as the next request's TTFT, not as an ITL gap. When the
server reports its costs (coopsched serve's /health) bounds come from them;
otherwise each request first runs alone and the run together must stay within
a stated multiple of those solo figures.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

from harness.live import client, stalls
from harness.live.solo import RULE as SOLO_RULE
from harness.live.solo import SOLO_RUNS
from harness.live.streamed import Solo, Streamed
from harness.run import metrics
from harness.run.scenario import RequestSpec, Scenario
from harness.verdict.target import (
    classic_served_check,
    completion_check,
    cost_checks,
    in_flight_check,
    overlap_note,
    solo_checks,
    speculated_note,
)
from mocks import CostModel

TIMEOUT_S = 300.0
TOGETHER_RUNS = 3  # attempts at a run together in which the requests overlap


class Target:
    def __init__(self, url: str) -> None:
        try:
            client.split_url(url)
        except ValueError:
            raise ValueError(f"--target {url!r}: want http://HOST:PORT") from None
        self.url = url if "://" in url else f"http://{url}"

    def ping(self) -> None:
        """A ValueError naming the URL when no server answers: before any request is sent or timed."""
        try:
            client.request(self.url, "GET", "/v1/models", timeout_s=5)
        except OSError as exc:
            raise ValueError(f"--target {self.url}: no server answered ({exc})") from None

    def get_json(self, path: str) -> dict | None:
        return client.get_json(self.url, path, timeout_s=10)

    def stream(self, body: dict, out: Streamed, origin_ns: int) -> None:
        """POST a streaming completion (the shared reader); each token's time is its event's arrival."""
        got = client.collect(self.url, body, timeout_s=TIMEOUT_S)
        out.sent_ms = (got.sent_ns - origin_ns) / 1e6
        out.error = got.error
        out.token_ids = got.token_ids
        out.token_times_ms = got.token_times_ms(origin_ns)
        out.end_ms = (time.perf_counter_ns() - origin_ns) / 1e6
        out.text = got.text
        out.finish_reason = got.finish_reason
        out.max_event_tokens = max(got.counts, default=1)
        out.server_id = next((a.event.get("id") for a in got.arrivals if a.event.get("id")), None)
        extension = next((a.event["coopsched"] for a in reversed(got.arrivals) if a.event.get("coopsched")), None)
        out.timings = got.timings
        if extension:
            out.served_speculatively = extension.get("served_speculatively")
            out.burst = extension.get("burst")
        if out.served_speculatively is None and out.timings is not None and "draft_n" in out.timings:
            out.served_speculatively = (out.timings.get("draft_n") or 0) > 0  # llama.cpp's own word for it
        out.stream = stalls.Stream.of(out.spec.id, out.kind, got)


def request_body(spec: RequestSpec, seed: int, model: str | None) -> dict:
    prompt = bytes(spec.prompt_tokens(seed)).decode("utf-8", errors="replace")
    body = {"prompt": prompt, "max_tokens": spec.max_tokens, "temperature": spec.temperature,
            "stream": True, "stream_options": {"include_usage": True},
            "speculative": spec.speculative, "return_token_ids": True, "return_tick_times": True}
    if spec.temperature > 0:
        body["seed"] = seed
    if spec.stop:
        body["stop"] = list(spec.stop)
    if model:
        body["model"] = model
    return body


def run_together(target: Target, specs, seed: int, model: str | None) -> list[Streamed]:
    """Every request on its own thread, sent at its arrival offset."""
    return run_closed(target, specs, set(), 0, 0.0, seed, model)


def run_closed(target: Target, specs: Sequence, looped: set[str], concurrency: int, start_ms: float, seed: int,
               model: str | None) -> list[Streamed]:
    """The one live driver: `concurrency` users from start_ms, each streaming the next unsent looped
    request when its last one ends; the other requests go at their own arrival offsets, each on its
    own thread (no looped requests: an open loop)."""
    outs = [Streamed(spec) for spec in specs]
    unsent = deque(o for o in outs if o.spec.id in looped)
    origin = time.perf_counter_ns()

    def at(ms: float) -> None:
        delay = ms / 1e3 - (time.perf_counter_ns() - origin) / 1e9
        if delay > 0:
            time.sleep(delay)

    def user() -> None:
        at(start_ms)
        while True:
            try:
                out = unsent.popleft()  # atomic: two users never take the same request
            except IndexError:
                return
            target.stream(request_body(out.spec, seed, model), out, origin)

    def fixed(out: Streamed) -> None:
        at(out.spec.arrival_ms)
        target.stream(request_body(out.spec, seed, model), out, origin)

    threads = [threading.Thread(target=user, daemon=True) for _ in range(min(concurrency, len(unsent)))]
    threads += [threading.Thread(target=fixed, args=(o,), daemon=True) for o in outs if o.spec.id not in looped]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S * max(1, len(unsent)))
    return outs


def drive(target: Target, specs: Sequence, workload, seed: int, model: str | None) -> list[Streamed]:
    """A scenario's requests live: a closed-loop [workload] through its users, the rest at their offsets."""
    if workload is not None and workload.is_closed:
        return run_closed(target, specs, set(workload.ids()), workload.concurrency or 1, workload.start_ms,
                          seed, model)
    return run_together(target, specs, seed, model)


def warm_up(target: Target, specs, seed: int, model: str | None) -> None:
    """A few tokens of each request, alone, before anything is measured: cold paths (first forward,
    compilation, allocation) would otherwise land in the solo figures or the first gaps."""
    for spec in specs:
        run_together(target, [replace(spec, arrival_ms=0.0, max_tokens=min(spec.max_tokens, 4))], seed, model)


# -- the trace ------------------------------------------------------------------------
def live_schedule(specs: Sequence[RequestSpec], solo: dict[str, Solo]) -> tuple[list[RequestSpec], dict]:
    """The scenario's arrivals scaled to the server's speed: a request sent after others is meant to
    find them running, so every arrival lands within the first half of each earlier request's solo
    run (a fast server would otherwise finish one before the next is sent). Never slower than written."""
    scale = 1.0
    for r in specs:
        for q in specs:
            life = solo[q.id].life_ms if q.id in solo else None
            if q.arrival_ms < r.arrival_ms and life:
                scale = min(scale, (q.arrival_ms + life / 2) / r.arrival_ms)
    scaled = [replace(r, arrival_ms=round(r.arrival_ms * scale, 3)) for r in specs]
    note = ("as written" if scale == 1.0 else
            f"arrivals x {scale:.3f}, so that each request is sent within the first half of the solo run of "
            f"every request sent before it")
    return scaled, {"scale": round(scale, 6), "note": note,
                    "arrival_ms": {r.id: r.arrival_ms for r in scaled}}


def run_against_target(scenario: Scenario, url: str, seed: int, console=None, *, warm: bool = True) -> dict:
    target = Target(url)
    target.ping()
    health = target.get_json("/health") or {}
    models = (target.get_json("/v1/models") or {}).get("data") or []
    model = models[0].get("id") if models else None  # no listed model: leave `model` out
    costs = health.get("costs") if isinstance(health.get("costs"), dict) else None
    workload = scenario.workload
    closed = workload is not None and workload.is_closed
    specs = list(scenario.specs(seed))

    if warm:
        warm_up(target, specs, seed, model)
    solo: dict[str, Solo] = {}
    schedule = None
    if costs is None:  # learn each request's solo figures first
        for spec in specs:
            solo[spec.id] = Solo([run_together(target, [replace(spec, arrival_ms=0.0)], seed, model)[0]
                                  for _ in range(SOLO_RUNS)])
        if not closed:  # a closed loop's arrivals are its finishes
            specs, schedule = live_schedule(specs, solo)
    attempts = 0
    while True:  # a client stalled at the wrong moment may keep the requests apart: try again
        before = client.spec_counters(client.try_scrape(target.url))  # the counters count the last attempt
        outs, attempts = drive(target, specs, workload, seed, model), attempts + 1
        if closed or attempts == TOGETHER_RUNS or overlap_note(outs) is None:
            break
    after = client.settled(lambda: client.spec_counters(client.try_scrape(target.url)))
    counted = counter_delta(before, after)

    checks = [completion_check(outs)]
    if closed:
        checks.append(in_flight_check(outs, workload.concurrency or 1, set(workload.ids())))
    if costs is not None:
        checks += cost_checks(outs, scenario, CostModel(**costs["profile"]), health, seed)
    else:  # R: the block size when /health gives it (coopsched serve on MLX reports no costs)
        checks += solo_checks(outs, solo, health.get("block_size"))
    served = classic_served_check(outs)
    if served:
        checks.append(served)
    trace = to_trace(scenario, outs, solo, [c.to_json() for c in checks], seed, url, health, model)
    trace["server"]["spec_counters"] = counted
    if schedule is not None:
        trace["schedule"] = schedule
    trace["together_runs"] = attempts
    note = speculated_note(outs)
    if note:
        trace["speculated_against_ask"] = [o.spec.id for o in outs if o.was_speculated_against_ask]
        trace["speculated_note"] = note
    if console is not None:
        print_verdict(console, trace)
    return trace


def counter_delta(before: dict | None, after: dict | None) -> dict | None:
    """What the run added to the server's speculative counters (None: it serves none)."""
    if before is None or after is None:
        return None
    return {key: None if after[key] is None or before[key] is None else after[key] - before[key]
            for key in after}


def _request_json(o: Streamed, seed: int) -> dict:
    times = [round(t, 3) for t in o.token_times_ms]
    return {"id": o.spec.id, "server_id": o.server_id, "speculative": o.is_speculative, "eligible": o.spec.speculative,
            "prompt_token_ids": list(o.spec.prompt_tokens(seed)), "token_ids": list(o.token_ids),
            "num_tokens": len(times), "token_times_ms": times, "arrival_ms": round(o.sent_ms, 3),
            "tick_end_ms": _tick_ends_ms(o), "end_ms": None if o.end_ms is None else round(o.end_ms, 3),
            "timings": o.timings, "finish_reason": o.finish_reason, "error": o.error,
            "metrics": metrics.request_metrics(o.sent_ms, o.token_times_ms)}


def _tick_ends_ms(o: Streamed) -> list[float] | None:
    """Each token's engine tick end on the trace's clock (servers that stamp their events)."""
    if o.stream is None or o.stream.ticks_ns is None:
        return None
    origin = o.stream.sent_ns - round(o.sent_ms * 1e6)
    return [round((t - origin) / 1e6, 3) for t in o.stream.ticks_ns]


def to_trace(scenario, outs, solo, checks, seed, url, health, model) -> dict:
    requests = [_request_json(o, seed) for o in outs]
    trace = {"scenario": scenario.name, "mode": health.get("mode") or "external", "clock": "real", "seed": seed,
             "target": url, "server": {"model": model, "health": health or None},
             "requests": requests, "ticks": [], "bursts": [], "checks": checks,
             "throughput": metrics.throughput([{**r, "token_ids": [0] * r["num_tokens"]} for r in requests])}
    if solo:
        trace["solo"] = {i: {"ttft_ms": s.ttft_ms, "stall_ms": s.stall_ms, "num_tokens": s.num_tokens,
                             "runs": len(s.runs), "life_ms": s.life_ms, "pace_ms": stalls.pace_ms(s.streams),
                             "kind": s.runs[0].kind} for i, s in solo.items()}
    # a server's ticks are not visible over HTTP (its per-token tick stamps are in `tick_end_ms`);
    # only a server that reports BurstFinalized records (coopsched serve) has bursts
    trace["bursts"] = [{**o.burst, "seq_id": o.spec.id, "server_seq_id": o.burst.get("seq_id")}
                       for o in outs if o.burst]
    return trace


def print_verdict(console, trace: dict) -> None:
    console.print(f"[bold]{trace['scenario']}[/] against {trace['target']} (mode {trace['mode']}, real time)")
    if "solo" in trace:
        console.print(f"  the server reports no costs: each request ran alone first; rule: {SOLO_RULE}")
    counted = trace["server"].get("spec_counters")
    if counted:
        console.print("  the server's speculative counters over the run: " + ", ".join(
            f"{key} {'-' if value is None else f'{value:g}'}" for key, value in counted.items()), highlight=False)
    if trace.get("schedule", {}).get("scale", 1.0) != 1.0:
        console.print(f"  schedule: {trace['schedule']['note']}: {trace['schedule']['arrival_ms']}", highlight=False)
    if trace.get("speculated_note"):
        console.print(f"  [yellow]{trace['speculated_note']}[/]", highlight=False)
    for c in trace["checks"]:
        verdict = "skipped" if c.get("skipped") else ("[green]ok[/]" if c["ok"] else "[red]FAIL[/]")
        value = "-" if c["value"] is None else f"{c['value']:.1f}" if isinstance(c["value"], float) else c["value"]
        bound = "-" if c["bound"] is None else f"{c['bound']:.1f}" if isinstance(c["bound"], float) else c["bound"]
        console.print(f"  {c['name']}: {value} vs {bound} {verdict}  ({c['note']})", highlight=False)
