"""Measure what the server adds, and coopsched serve beside mlx_lm.server on the same tiny models.

    python tools/measure_server.py [--out reports/server-measure.json] [--skip-mlx] [--only-added]
    python tools/measure_server.py --only vs-mlx-lm --streams 16 --repeats 5 \
        [--draft] [--coopsched-args="--max-batch-prefill 16"] [--out PATH]

Not a test (real time, machine-dependent numbers): it prints a table and writes JSON.
1. classic ITL p50/p99 in process (engine events) vs over HTTP (client arrivals), 1 and 16 streams;
2. SSE tokens/s from a zero-cost mock at 32 streams;
3. aggregate tokens/s and TTFT p95 at 4 and 16 concurrent streams, coopsched serve vs mlx_lm.server,
   without and with a draft model (the latter serializes requests in mlx_lm.server);
   `--only vs-mlx-lm` runs only this, `--repeats` times per server (TTFTs pooled, tokens/s the
   median of the repeats), with extra `coopsched serve` flags (chunked or batched prefill).
4. what HTTP/SSE adds to each token at 1, 16 and 64 streams: the server stamps every event with its
   engine tick end and the moment its SSE layer wrote it (`return_tick_times`), the client notes the
   arrival (all on CLOCK_MONOTONIC): tick end -> written, written -> read, and a gap's client length
   minus its engine length (--only-added runs this part alone);
5. (--engine-alone [--busy N]) the engine with no HTTP at all, in this process, concurrency2's shape
   (a 500-token classic row, a 64-token speculative request every 800 ms): its classic gaps, to
   tell the engine's own noise under CPU load from what a server adds.
The client is one asyncio loop on raw sockets so it stays cheaper than the servers it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from harness.live import client
from harness.run import metrics

ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("MLXCEL_")},
       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def pct(samples, q) -> float | None:
    return float(np.percentile(samples, q)) if len(samples) else None


# -- a minimal streaming client: raw asyncio sockets, the shared event decoding ------------------
async def post_stream(host: str, port: int, body: dict) -> tuple[int, list]:
    """POST /v1/completions on a raw socket: when the request was written (ns) and each event as read."""
    reader, writer = await asyncio.open_connection(host, port)
    payload = json.dumps(body).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(payload) + payload)
    await writer.drain()
    sent_ns = time.perf_counter_ns()
    arrivals = []
    while True:
        line = await reader.readline()
        item = client.decode_line(line, time.perf_counter_ns()) if line else client.DONE
        if item is client.DONE:
            break
        if item is not None:
            arrivals.append(item)
    writer.close()
    return sent_ns, arrivals


async def stream_one(host: str, port: int, body: dict, t0_ns: int) -> dict:
    sent_ns, arrivals = await post_stream(host, port, body)
    counts = client.token_counts(arrivals)  # a multi-token event is one arrival of n tokens
    times = metrics.token_times([(a.time_ns - t0_ns) / 1e9 for a in arrivals], counts)
    return {"sent": (sent_ns - t0_ns) / 1e9, "arrivals": times, "completion_tokens": len(times)}


async def stream_stamped(host: str, port: int, body: dict) -> list[tuple[int, int, int]]:
    """(tick end, written, read) ns of every token of one stream (the server stamps each event)."""
    _, arrivals = await post_stream(host, port, {**body, "return_tick_times": True, "return_token_ids": True})
    return [(item.event["coopsched"]["tick_end_ns"], item.event["coopsched"]["sent_ns"], item.time_ns)
            for item in arrivals for _ in range(item.n_tokens)]


def server_added(streams=(1, 16, 64), max_tokens: int = 200, decode_ms: float = 5.0) -> dict:
    """Per token: tick end -> SSE write (the server's HTTP layer), write -> client read (socket and
    client), tick end -> read (all it adds); per gap: client gap - engine gap."""
    out = {}
    top = max(streams)
    with coopsched_serve("--decode-ms", str(decode_ms), "--max-batch-size", str(top), "--num-slots",
                         str(top)) as server:
        host, port, _ = client.split_url(server.url)

        async def many(n: int):
            return await asyncio.gather(*(stream_stamped(host, port, body(i, max_tokens, False)) for i in range(n)))

        asyncio.run(many(1))  # warm-up
        for n in streams:
            rows = asyncio.run(many(n))
            ms = lambda xs: np.asarray(xs, dtype=np.float64) / 1e6
            layer = ms([w - t for r in rows for t, w, _ in r])
            wire = ms([a - w for r in rows for _, w, a in r])
            added = ms([a - t for r in rows for t, _, a in r])
            extra = ms([(a2 - a1) - (t2 - t1) for r in rows for (t1, _, a1), (t2, _, a2) in itertools.pairwise(r)
                        if t2 != t1])
            stat = lambda a: {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
                              "max_ms": float(a.max())}
            out[f"{n}_streams"] = {"tokens": int(added.size), "tick_end_to_written": stat(layer),
                                   "written_to_read": stat(wire), "tick_end_to_read": stat(added),
                                   "gap_client_minus_engine": stat(extra), "load_average": os.getloadavg()[0]}
    return out


def engine_alone(busy: int = 0) -> dict:
    import subprocess

    from coopsched.clock import RealClock
    from coopsched.core import Request, Scheduler, SchedulerConfig
    from coopsched.engine import Engine
    from mocks import CostModel, MockBackend

    clock = RealClock()
    times: dict[str, list[float]] = {}
    engine = Engine(Scheduler(SchedulerConfig(max_batch_size=8, num_kv_slots=32)),
                    MockBackend(clock, CostModel.simple(5.0, 30.0, 0.2, 4)), clock,
                    on_event=lambda e: times.setdefault(e.seq_id, []).extend([e.time_ms] * len(e.token_ids)))
    requests = [Request("classic", tuple(b"The classic row."), max_tokens=500, speculative=False)]
    requests += [Request(f"s{i}", tuple(b"Speculate, then verify."), max_tokens=64, arrival_ms=40 + 800 * i)
                 for i in range(20)]
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        engine.run(requests)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    gaps = np.diff(times["classic"])
    return {"busy_loops": busy, "gaps": int(gaps.size), "p50_ms": float(np.percentile(gaps, 50)),
            "p99_ms": float(np.percentile(gaps, 99)), "max_ms": float(gaps.max()), "load_average": os.getloadavg()[0]}


def print_added(added: dict) -> None:
    print("| streams | tokens | tick end -> SSE write p50 / p99 / max | write -> client read | tick end -> read "
          "(all the server adds) | gap: client - engine | load |")
    print("|---|---|---|---|---|---|---|")
    f = lambda d: f"{d['p50_ms']:.2f} / {d['p99_ms']:.2f} / {d['max_ms']:.2f}"
    for name, r in added.items():
        print(f"| {name.split('_')[0]} | {r['tokens']} | {f(r['tick_end_to_written'])} | {f(r['written_to_read'])} | "
              f"{f(r['tick_end_to_read'])} | {f(r['gap_client_minus_engine'])} | {r['load_average']:.1f} |")


async def stream_many(url: str, bodies: list[dict]) -> list[dict]:
    host, port, _ = client.split_url(url)
    t0_ns = time.perf_counter_ns()
    return await asyncio.gather(*(stream_one(host, port, b, t0_ns) for b in bodies))


def body(i: int, max_tokens: int, speculative: bool = True, model: str | None = None) -> dict:
    out = {"prompt": f"Request {i}: tell me about cooperative scheduling", "max_tokens": max_tokens,
           "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
           "speculative": speculative}
    if model:
        out["model"] = model
    return out


def summarize(results: list[dict]) -> dict:
    gaps = [b - a for r in results for a, b in zip(r["arrivals"], r["arrivals"][1:])]
    ttfts = [r["arrivals"][0] - r["sent"] for r in results if r["arrivals"]]
    start = min(r["sent"] for r in results)
    end = max(r["arrivals"][-1] for r in results if r["arrivals"])
    tokens = sum(r["completion_tokens"] for r in results)
    return {"itl_p50_ms": 1e3 * pct(gaps, 50), "itl_p99_ms": 1e3 * pct(gaps, 99),
            "ttft_p50_ms": 1e3 * pct(ttfts, 50), "ttft_p95_ms": 1e3 * pct(ttfts, 95),
            "ttft_max_ms": 1e3 * max(ttfts), "tokens": tokens, "aggregate_tok_s": tokens / (end - start)}


# -- servers (the shared spawner: free loopback port, /health, SIGTERM) ------------------------------
def coopsched_serve(*args: str, gates: dict | None = None):
    return client.spawn_server(["--log-level", "warning", *args], env={**ENV, **(gates or {})}, timeout_s=120)


def mlx_lm_server(model: Path, draft: Path | None):
    port = client.free_port()
    command = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model), "--host", client.LOOPBACK,
               "--port", str(port), "--log-level", "WARNING"]
    if draft is not None:
        command += ["--draft-model", str(draft)]
    return client.spawn_server(command=command, port=port, env=ENV, timeout_s=120)


# -- 1. overhead: in process vs over HTTP ------------------------------------------------------
def in_process_itl(num_streams: int, max_tokens: int, decode_ms: float) -> dict:
    from coopsched.clock import RealClock
    from coopsched.core import Request, Scheduler, SchedulerConfig
    from coopsched.engine import Engine
    from mocks import CostModel, MockBackend

    clock = RealClock()
    backend = MockBackend(clock, CostModel.simple(decode_ms, 30.0, 0.2))
    config = SchedulerConfig(max_batch_size=max(num_streams, 1), num_kv_slots=max(num_streams, 1))
    times: dict[str, list[float]] = {}
    engine = Engine(Scheduler(config), backend, clock,
                    on_event=lambda e: times.setdefault(e.seq_id, []).extend([e.time_ms] * len(e.token_ids)))
    engine.run([Request(f"r{i}", tuple(body(i, 1)["prompt"].encode()), max_tokens=max_tokens, speculative=False)
                for i in range(num_streams)])
    gaps = [b - a for t in times.values() for a, b in itertools.pairwise(t)]
    return {"itl_p50_ms": pct(gaps, 50), "itl_p99_ms": pct(gaps, 99)}


def overhead(decode_ms: float = 5.0, max_tokens: int = 200) -> dict:
    out = {}
    with coopsched_serve("--decode-ms", str(decode_ms), "--max-batch-size", "16", "--num-slots", "32") as server:
        asyncio.run(stream_many(server.url, [body(0, 8, False)]))  # warm-up
        for n in (1, 16):
            http = summarize(asyncio.run(stream_many(server.url, [body(i, max_tokens, False) for i in range(n)])))
            out[f"{n}_streams"] = {"in_process": in_process_itl(n, max_tokens, decode_ms),
                                   "http": {k: http[k] for k in ("itl_p50_ms", "itl_p99_ms")}}
    return out


# -- 2. SSE throughput from a zero-cost mock -----------------------------------------------------
def sse_throughput(num_streams: int = 32, max_tokens: int = 1000) -> dict:
    with coopsched_serve("--decode-ms", "0", "--round-ms", "0", "--prefill-ms-per-token", "0",
                         "--max-batch-size", str(num_streams), "--num-slots", str(num_streams)) as server:
        asyncio.run(stream_many(server.url, [body(0, 8, False)]))
        result = summarize(asyncio.run(stream_many(server.url, [body(i, max_tokens, False)
                                                                for i in range(num_streams)])))
    return {"streams": num_streams, "tokens": result["tokens"], "sse_tok_s": result["aggregate_tok_s"]}


# -- 3. side by side with mlx_lm.server --------------------------------------------------------------
def side_by_side(model: Path, draft: Path, max_tokens: int = 128) -> dict:
    out = {}
    for label, with_draft in (("no_draft", False), ("draft", True)):
        d = draft if with_draft else None
        servers = {
            "coopsched": lambda d=d: coopsched_serve("--backend", "mlx", "--model", str(model), *(
                ["--draft-model", str(d)] if d else []), "--max-batch-size", "16", "--num-slots", "32"),
            "mlx_lm": lambda d=d: mlx_lm_server(model, d),
        }
        for name, start in servers.items():
            with start() as server:
                asyncio.run(stream_many(server.url, [body(0, 8)]))
                for n in (4, 16):
                    result = summarize(asyncio.run(stream_many(server.url, [body(i, max_tokens) for i in range(n)])))
                    out.setdefault(label, {}).setdefault(f"{n}_streams", {})[name] = {
                        k: result[k] for k in ("aggregate_tok_s", "ttft_p95_ms", "ttft_max_ms", "tokens")}
        for n in (4, 16):
            row = out[label][f"{n}_streams"]
            row["throughput_ratio"] = row["coopsched"]["aggregate_tok_s"] / row["mlx_lm"]["aggregate_tok_s"]
    return out


def vs_mlx_lm(model: Path, draft: Path | None, streams: int, repeats: int, coopsched_args: list[str],
              max_tokens: int = 128, gates: dict | None = None) -> dict:
    """One workload of `streams` concurrent streams, `repeats` times per server, the two servers one
    after the other (never at once: they share the CPU); TTFTs pooled over the repeats."""
    servers = {
        "coopsched": lambda: coopsched_serve("--backend", "mlx", "--model", str(model), *(
            ["--draft-model", str(draft)] if draft else []), "--max-batch-size", "16", "--num-slots", "32",
            *coopsched_args, gates=gates),
        "mlx_lm": lambda: mlx_lm_server(model, draft),
    }
    out: dict = {"streams": streams, "repeats": repeats, "draft": draft is not None,
                 "coopsched_args": coopsched_args, "gates": gates or {}, "max_tokens": max_tokens}
    for name, start in servers.items():
        with start() as server:
            asyncio.run(stream_many(server.url, [body(0, 8)]))  # warm-up
            runs = [asyncio.run(stream_many(server.url, [body(i, max_tokens) for i in range(streams)]))
                    for _ in range(repeats)]
        per_run = [summarize(r) for r in runs]
        pooled = summarize([r for run in runs for r in run])
        out[name] = {"ttft_p50_ms": pooled["ttft_p50_ms"], "ttft_p95_ms": pooled["ttft_p95_ms"],
                     "ttft_max_ms": pooled["ttft_max_ms"],
                     "aggregate_tok_s": float(np.median([x["aggregate_tok_s"] for x in per_run])),
                     "aggregate_tok_s_runs": [round(x["aggregate_tok_s"], 1) for x in per_run],
                     "ttft_p95_ms_runs": [round(x["ttft_p95_ms"], 1) for x in per_run],
                     "tokens": pooled["tokens"]}
    out["throughput_ratio"] = out["coopsched"]["aggregate_tok_s"] / out["mlx_lm"]["aggregate_tok_s"]
    out["ttft_p95_ratio"] = out["coopsched"]["ttft_p95_ms"] / out["mlx_lm"]["ttft_p95_ms"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("reports/server-measure.json"))
    parser.add_argument("--skip-mlx", action="store_true")
    parser.add_argument("--only", choices=("vs-mlx-lm",), help="run only this measurement")
    parser.add_argument("--streams", type=int, default=16, help="--only vs-mlx-lm: concurrent streams")
    parser.add_argument("--repeats", type=int, default=3, help="--only vs-mlx-lm: workloads per server")
    parser.add_argument("--draft", action="store_true", help="--only vs-mlx-lm: both servers get the draft model")
    parser.add_argument("--coopsched-args", default="", help="--only vs-mlx-lm: extra `coopsched serve` flags")
    parser.add_argument("--max-tokens", type=int, default=128, help="--only vs-mlx-lm: tokens per request")
    parser.add_argument("--gate", action="append", default=[], metavar="MLXCEL_NAME=VALUE",
                        help="--only vs-mlx-lm: a gate for coopsched serve only (repeatable)")
    parser.add_argument("--only-added", action="store_true", help="only part 4 (what HTTP/SSE adds)")
    parser.add_argument("--engine-alone", action="store_true", help="only part 5 (the engine without HTTP)")
    parser.add_argument("--busy", type=int, default=0, help="part 5: busy loops beside the engine")
    args = parser.parse_args()
    if args.only == "vs-mlx-lm":
        from coopsched.backends.model_build import ensure_tiny_models

        model, draft = ensure_tiny_models()
        report = vs_mlx_lm(model, draft if args.draft else None, args.streams, args.repeats,
                           args.coopsched_args.split(), args.max_tokens,
                           dict(g.split("=", 1) for g in args.gate))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        print(json.dumps(report, indent=1))
        return 0
    if args.engine_alone:
        print(json.dumps(engine_alone(args.busy)))
        return 0
    if args.only_added:
        added = server_added()
        print_added(added)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"server_added": added}, indent=1) + "\n")
        return 0
    report = {"overhead": overhead(), "sse": sse_throughput(), "server_added": server_added()}
    if not args.skip_mlx:
        from coopsched.backends.model_build import ensure_tiny_models

        model, draft = ensure_tiny_models()
        report["vs_mlx_lm"] = side_by_side(model, draft)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    print_added(report["server_added"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
