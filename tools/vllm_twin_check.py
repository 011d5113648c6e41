"""A held-out open-loop workload live against a server N times and on its twins, per metric.

    python tools/vllm_twin_check.py fit --target URL --profile cost.json --out vllm.json
    python tools/vllm_twin_check.py check --target URL --twin before=cost.json --twin after=vllm.json \
        --rate 4 --num-requests 40 --runs 3 --json out.json

`fit` adds what the vllm twin needs to a `calibrate --target` profile (harness/calibrate/server_params/vllm.py):
"server": "vllm", its "server_params" and the acceptance vLLM counted. `check` prints, per twin and
metric, predicted, measured (mean of the live runs), error and the live runs' spread (max - min over
mean). A measurement script, not a test: until `calibrate --report` reports the spread itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np

from coopsched.core import SchedulerConfig
from harness.calibrate import fit as fits
from harness.calibrate import server_params, target, twin
from harness.live import client
from harness.run import metrics
from harness.run.runner import Profile
from harness.run.scenario import Scenario
from harness.run.workload import Workload

METRICS = ("aggregate_tok_s", "ttft_p50_ms", "ttft_p95_ms", "itl_mean_ms", "classic_itl_p99_ms")
TOLERANCE = {"aggregate_tok_s": 0.10, "ttft_p50_ms": 0.20, "ttft_p95_ms": 0.25, "itl_mean_ms": 0.10,
             "classic_itl_p99_ms": 0.20}


def workload(rate: float, num_requests: int, seed: int) -> Scenario:
    """Poisson arrivals, prompts of 16-160 tokens, 24-96 output tokens, half of them speculative."""
    table = {"arrival": "poisson", "num_requests": num_requests, "rate_per_s": rate,
             "prompt_len": {"min": 16, "max": 160}, "max_tokens": {"min": 24, "max": 96}, "speculative_share": 0.5}
    specs = Workload.parse(table, Path(".")).specs(seed)
    return Scenario(f"held-out-{rate:g}", requests=tuple(specs))


def figures(runs: list[list[dict]]) -> dict[str, float | None]:
    """The metrics over pooled runs: throughput the runs' mean, the rest over pooled samples."""
    rates, ttft, gaps, classic = [], [], [], []
    for run in runs:
        rows = [{**r, "token_ids": [0] * r["num_tokens"]} for r in run]
        rate = metrics.throughput(rows)["aggregate_tok_s"]
        if rate is not None:
            rates.append(rate)
        for r in run:
            times = r["token_times_ms"]
            if times:
                ttft.append(times[0] - r["arrival_ms"])
            run_gaps = [b - a for a, b in pairwise(times)]
            gaps += run_gaps
            classic += [] if r["speculative"] else run_gaps
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else None
    return {"aggregate_tok_s": float(np.mean(rates)) if rates else None, "ttft_p50_ms": pct(ttft, 50),
            "ttft_p95_ms": pct(ttft, 95), "itl_mean_ms": float(np.mean(gaps)) if gaps else None,
            "classic_itl_p99_ms": pct(classic, 99)}


def spread(runs: list[list[dict]]) -> dict[str, float | None]:
    """Per metric, (max - min) / mean over the live runs taken one at a time."""
    each = [figures([run]) for run in runs]
    out = {}
    for m in METRICS:
        values = [f[m] for f in each if f[m] is not None]
        out[m] = (max(values) - min(values)) / float(np.mean(values)) if len(values) > 1 and np.mean(values) else None
    return out


def twin_config(profile: Profile, speculates: bool) -> SchedulerConfig:
    params = profile.server_params
    k = int(params.get("num_speculative_tokens") or 3)
    seqs = int(params.get("max_num_seqs") or 8)
    return SchedulerConfig(mode="slice", block_size=k + 1, has_drafter=speculates, max_batch_size=seqs,
                           num_kv_slots=max(16, seqs))


def refit(profile: Profile, probes: list[dict[int, float]]) -> Profile:
    """The profile with its step costs from the probes taken beside the live runs (their means)."""
    batches = sorted(set.intersection(*(set(p) for p in probes)))
    ms = fits.monotone([float(np.mean([p[b] for p in probes])) for b in batches])
    points = [[b, round(v, 4)] for b, v in zip(batches, ms)]
    k = int(profile.server_params.get("num_speculative_tokens") or 0)
    verify = [[b * (k + 1), v] for b, v in points] if k else [points[0]]
    return replace(profile, cost=replace(profile.cost, decode_ms=points, verify_ms=verify))


def check(args: argparse.Namespace) -> int:
    server = target.Server.connect(args.target)
    scenario = workload(args.rate, args.num_requests, args.seed)
    live, probes = [], []
    scrape = lambda: client.try_scrape(server.url)
    for i in range(args.runs):  # --refit: one step's cost probed beside each live run, on the same machine
        if args.refit:
            probes.append(server_params.vllm.step_costs(server, scrape, (1, 2, 4, 8), repeats=1))
        live.append(target.measure_workload(server, scenario.requests, 1000 + i))
    measured, spreads = figures(live), spread(live)
    if probes:
        print("step costs beside the live runs: " + "; ".join(", ".join(f"B={b} {v:.1f}" for b, v in p.items())
                                                              for p in probes))
    report = {"target": args.target, "probes": probes, "rate_per_s": args.rate, "num_requests": args.num_requests,
              "runs": args.runs, "load_average": os.getloadavg()[0],
              "measured": measured, "spread": spreads, "twins": {}}
    print(f"{args.target}: {args.num_requests} requests at {args.rate:g}/s, {args.runs} live runs")
    for spec in args.twin:
        name, path = spec.split("=", 1)
        profile = Profile.load(path)
        if probes and profile.server == "vllm":
            profile = refit(profile, probes)
        speculates = profile.cost.accept_prob is not None
        held_out = scenario if speculates else twin.classic(scenario)
        config = twin_config(profile, speculates) if profile.server == "vllm" else target.twin_config_of(
            server, None, args.block_size)
        if not speculates:
            config = config.with_(has_drafter=False)
        runs = twin.simulate(profile, config, range(args.seeds), held_out)
        sent = [spec.speculative for spec in scenario.requests]  # classic = sent classic (vLLM speculates all)
        predicted = figures([[{**row, "speculative": flag} for row, flag in zip(run, sent)] for run in runs])
        rows = {}
        for m in METRICS:
            p, v = predicted[m], measured[m]
            error = p / v - 1 if p is not None and v else None
            ok = error is not None and (abs(error) <= TOLERANCE[m] or abs(error) <= 1.5 * (spreads[m] or 0))
            rows[m] = {"predicted": p, "measured": v, "error": error, "ok": ok}
            print(f"  {name:7s} {m:20s} predicted {p or 0:9.2f}  measured {v or 0:9.2f}  error "
                  f"{(error or 0):+7.1%}  spread {(spreads[m] or 0):6.1%}  {'ok' if ok else 'MISS'}")
        report["twins"][name] = {"profile": path, "server": profile.server, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


def fit(args: argparse.Namespace) -> int:
    server = target.Server.connect(args.target)
    profile = json.loads(Path(args.profile).read_text())
    fitted = profile.get("calibrated", {}).get("fit", {})
    params, evidence, cost = server_params.fit_params("vllm", server, profile, fitted, print)
    profile.update(cost, server="vllm", server_params=params)
    profile.setdefault("calibrated", {})["server_fit"] = evidence
    Path(args.out).write_text(json.dumps(profile, indent=1) + "\n")
    print(f"wrote {args.out}: server vllm, server_params {params}, {cost or 'no cost overrides'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit")
    f.add_argument("--target", required=True)
    f.add_argument("--profile", required=True)
    f.add_argument("--out", required=True)
    c = sub.add_parser("check")
    c.add_argument("--target", required=True)
    c.add_argument("--twin", action="append", default=[], metavar="NAME=PROFILE")
    c.add_argument("--rate", type=float, required=True)
    c.add_argument("--num-requests", type=int, default=40)
    c.add_argument("--runs", type=int, default=3)
    c.add_argument("--seeds", type=int, default=5)
    c.add_argument("--seed", type=int, default=7)
    c.add_argument("--block-size", type=int, default=4)
    c.add_argument("--json")
    c.add_argument("--refit", action="store_true", help="probe vLLM's step cost beside each live run for the vllm twin")
    args = parser.parse_args(argv)
    return check(args) if args.command == "check" else fit(args)


if __name__ == "__main__":
    sys.exit(main())
