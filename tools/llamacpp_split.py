"""Where a llama-server step's time goes: the held-out workload run live with the server's own books
(/metrics), its threads' CPU and run-queue time (/proc/PID/task/*/schedstat: the compute thread, the
HTTP threads), beside the twin's books for the same workload; and lone rows at growing prompts.

    python tools/llamacpp_split.py books URL PID --profile P.json --rates 24,48 --runs 2
    python tools/llamacpp_split.py context URL PID --prompts 16,128,256,512 --rows 1,4

Linux only (schedstat); PID is llama-server's (its main thread runs the slot loop).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from pathlib import Path

from coopsched.core.types import TickKind
from harness.calibrate import heldout, target, twin
from harness.live import client
from harness.run import runner

BOOKS = ("n_decode_total", "n_busy_slots_per_decode", "spec_decode_num_drafts_total", "prompt_tokens_total")


def threads(pid: int) -> dict[int, tuple[float, float]]:
    """Per thread: ms run on a CPU, ms waited on a run queue."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        run_ns, wait_ns, _ = map(int, Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split())
        out[int(tid)] = (run_ns / 1e6, wait_ns / 1e6)
    return out


def books(url: str) -> dict[str, float]:
    scraped = client.settled(lambda: client.try_scrape(url)) or {}
    return {name: scraped.get(f"llamacpp:{name}", 0.0) for name in BOOKS}


def timings(got: client.Collected) -> dict:
    return next((a.event["timings"] for a in reversed(got.arrivals) if isinstance(a.event.get("timings"), dict)), {})


def measured(server: target.Server, pid: int, bodies: list[dict], offsets: list[float] | None) -> dict:
    """One pass: the server's steps and busy slots per step, its threads' CPU, the client's mean ITL."""
    b0, t0, load = books(server.url), threads(pid), os.getloadavg()[0]
    began = time.perf_counter()
    outs = server.together(bodies, offsets)
    wall = (time.perf_counter() - began) * 1e3
    b1, t1 = books(server.url), threads(pid)
    steps = b1["n_decode_total"] - b0["n_decode_total"]
    busy = b1["n_busy_slots_per_decode"] * b1["n_decode_total"] - b0["n_busy_slots_per_decode"] * b0["n_decode_total"]
    zero = (0.0, 0.0)
    delta = {tid: (run - t0.get(tid, zero)[0], wait - t0.get(tid, zero)[1]) for tid, (run, wait) in t1.items()}
    gaps = [b - a for got in outs for a, b in itertools.pairwise(got.token_times_ms(got.sent_ns))]
    return {"load": round(load, 2), "wall_ms": round(wall, 1), "steps": steps,
            "busy_per_step": round(busy / max(steps, 1), 2),
            "drafts": b1["spec_decode_num_drafts_total"] - b0["spec_decode_num_drafts_total"],
            "compute_ms": round(delta[pid][0], 1), "compute_waited_ms": round(delta[pid][1], 1),
            "http_ms": round(sum(run for tid, (run, _) in delta.items() if tid != pid), 1),
            "prompt_ms": round(sum(timings(o).get("prompt_ms", 0.0) for o in outs), 1),
            "itl_mean_ms": round(statistics.mean(gaps), 3) if gaps else None}


def on_twin(profile: runner.Profile, rate: float, num: int) -> dict:
    scen = heldout.workload(rate, num)
    run = runner.execute(runner.priced(scen, profile), twin.twin_config("slice", 4), heldout.SEED)
    ticks = [t for t in run.ticks if t.kind is not TickKind.IDLE]
    gaps = [b - a for times in run.token_times.values() for a, b in itertools.pairwise(times)]
    return {"steps": len(ticks), "busy_per_step": round(statistics.mean(len(t.request_ids) for t in ticks), 2),
            "compute_ms": round(sum(t.end_ms - t.start_ms for t in ticks), 1),
            "itl_mean_ms": round(statistics.mean(gaps), 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("books", "context"))
    parser.add_argument("url")
    parser.add_argument("pid", type=int)
    parser.add_argument("--profile", type=Path, help="books: the calibrated profile whose twin runs the same workload")
    parser.add_argument("--rates", default="24,48")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--requests", type=int, default=heldout.NUM_REQUESTS)
    parser.add_argument("--prompts", default="16,128,256,512", help="context: prompt characters")
    parser.add_argument("--rows", default="1,4", help="context: requests decoding together")
    args = parser.parse_args(argv)
    server = target.Server.connect(args.url)
    seeds = itertools.count(int(time.time()))
    if args.what == "context":
        for rows, chars in itertools.product(map(int, args.rows.split(",")), map(int, args.prompts.split(","))):
            for _ in range(args.runs):
                key = next(seeds)
                bodies = [server.body(target.text_prompt(chars, f"split:{key}:{i}"), 48, False) for i in range(rows)]
                print(json.dumps({"rows": rows, "prompt_chars": chars, **measured(server, args.pid, bodies, None)}))
        return 0
    profile = runner.Profile.load(args.profile) if args.profile else None
    for rate in map(float, args.rates.split(",")):
        specs = heldout.workload(rate, args.requests).specs(heldout.SEED)
        for _ in range(args.runs):
            seed = next(seeds)
            bodies = [server.body(bytes(s.prompt_tokens(seed)).decode("utf-8", errors="replace"), s.max_tokens,
                                  s.speculative) for s in specs]
            print(json.dumps({"rate": rate, "live": measured(server, args.pid, bodies, [s.arrival_ms for s in specs])}))
        if profile is not None:
            print(json.dumps({"rate": rate, "twin": on_twin(profile, rate, args.requests)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
