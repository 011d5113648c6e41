"""Does the mlx-lm twin predict mlx_lm.server? Calibrate a running server (the cost terms of
`coopsched calibrate --target`, then the scheduler parameters it does not report), then run a held-out
open-loop workload live several times and on the twin, before (coopsched's scheduler at the calibrated
costs) and after (the mlx-lm model), and print per metric predicted, measured, error and live spread.

    python tools/mlxlm_twin.py calibrate URL P.json
    python tools/mlxlm_twin.py check URL P.json --rate 8 --requests 40 --runs 3 --json R.json
    python tools/mlxlm_twin.py ladder URL --rates 4,8,16,32

A stand-in for `calibrate --report` until it can run a workload of one's choosing on a server's twin.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import numpy as np

from coopsched.clock import ManualClock
from coopsched.core import SchedulerConfig
from coopsched.engine import Engine
from coopsched.twins import make_scheduler
from harness.calibrate import server_params, target
from harness.calibrate.heldout import METRICS
from harness.calibrate.heldout import TOLERANCE as LIMITS  # calibrate --report's rule
from harness.run import metrics, runner
from harness.run.scenario import Scenario
from harness.run.workload import Workload
from mocks import CostModel


def workload(rate: float, num: int) -> Scenario:
    """Held out: Poisson arrivals, mixed lengths, half the requests speculative (the calibration's
    probes are fixed lengths sent together or alone)."""
    table = {"arrival": "poisson", "num_requests": num, "rate_per_s": rate, "prompt_len": {"min": 16, "max": 64},
             "max_tokens": {"min": 32, "max": 96}, "speculative_share": 0.5}
    return Scenario(name=f"heldout-{rate:g}", description="held-out open loop",
                    workload=Workload.parse(table, Path(".")))


def figures(rows: list[dict]) -> dict[str, float | None]:
    """One run's metrics: rows of {arrival_ms, token_times_ms, speculative (the workload's flag)}."""
    rate = metrics.throughput([{**r, "token_ids": [0] * len(r["token_times_ms"])} for r in rows])
    ttft = [r["token_times_ms"][0] - r["arrival_ms"] for r in rows if r["token_times_ms"]]
    gaps = [b - a for r in rows for a, b in pairwise(r["token_times_ms"])]
    classic = [b - a for r in rows if not r["speculative"] for a, b in pairwise(r["token_times_ms"])]
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else None
    return {"aggregate_tok_s": rate["aggregate_tok_s"], "ttft_p50_ms": pct(ttft, 50), "ttft_p95_ms": pct(ttft, 95),
            "itl_mean_ms": float(np.mean(gaps)) if gaps else None, "classic_itl_p99_ms": pct(classic, 99)}


def live(url: str, scenario: Scenario, run: int) -> list[dict]:
    server = target.Server.connect(url)
    specs = scenario.specs(0)  # the same arrivals every run; fresh prompts (the server caches prefixes)
    rows = target.measure_workload(server, specs, 1000 + run)
    return [{**row, "speculative": spec.speculative} for row, spec in zip(rows, specs)]


def simulate(profile: dict, kind: str, params: dict, scenario: Scenario, seed: int) -> list[dict]:
    cost = CostModel(**{k: v for k, v in profile.items() if k in CostModel.__dataclass_fields__})
    config = SchedulerConfig(mode="slice", block_size=4, num_kv_slots=128, max_batch_size=8,
                             has_drafter=kind != "coopsched" or profile.get("accept_prob") is not None)
    clock = ManualClock()
    backend = runner.mock_backend(clock, scenario, seed, cost)
    scheduler = make_scheduler(kind, config, params)
    times: dict[str, list[float]] = {}
    engine = Engine(scheduler, backend, clock,
                    on_event=lambda e: times.setdefault(e.seq_id, []).extend([e.time_ms] * len(e.token_ids)))
    requests = scenario.build_requests(0)
    flags = {r.id: r.speculative for r in requests}
    if kind == "coopsched" and profile.get("accept_prob") is None:  # it never speculated: all classic
        for r in requests:
            r.speculative = False
    engine.run(requests)
    return [{"arrival_ms": r.arrival_ms, "token_times_ms": times.get(r.id, []), "speculative": flags[r.id]}
            for r in requests]


def mean_of(runs: list[dict]) -> dict:
    out = {}
    for m in METRICS:
        xs = [r[m] for r in runs if r[m] is not None]
        out[m] = float(np.mean(xs)) if xs else None
    return out


def spread_of(runs: list[dict]) -> dict:
    out = {}
    for m in METRICS:
        xs = [r[m] for r in runs if r[m] is not None]
        out[m] = (max(xs) - min(xs)) / float(np.mean(xs)) if len(xs) > 1 and np.mean(xs) else None
    return out


def check(args) -> int:
    document = json.loads(Path(args.profile).read_text())
    scenario = workload(args.rate, args.requests)
    runs = []
    for i in range(args.runs):
        runs.append(figures(live(args.url, scenario, i)))
        print(f"live run {i + 1}: " + ", ".join(f"{m} {_f(runs[-1][m])}" for m in METRICS), flush=True)
    measured, spread = mean_of(runs), spread_of(runs)
    before = {**document, **document.get("calibrated", {}).get("coopsched_terms", {})}
    twins = {"before": mean_of([figures(simulate(before, "coopsched", {}, scenario, s)) for s in range(3)]),
             "after": mean_of([figures(simulate(document, "mlx-lm", document.get("server_params", {}), scenario, s))
                               for s in range(3)])}
    report = {"rate_per_s": args.rate, "requests": args.requests, "runs": runs, "measured": measured,
              "spread": spread, "load_average": os.getloadavg()[0], "server_params": document.get("server_params")}
    print(f"{'metric':20} {'measured':>10} {'spread':>7} {'before':>10} {'err':>7} {'after':>10} {'err':>7}  within")
    for m in METRICS:
        row = {}
        for name, predicted in twins.items():
            p, live_m = predicted[m], measured[m]
            error = p / live_m - 1 if p is not None and live_m else None
            row[name] = {"predicted": p, "error": error}
        limit = max(LIMITS[m], 1.5 * (spread[m] or 0.0))  # the target, or 1.5x the live runs' own spread
        for name in twins:
            error = row[name]["error"]
            row[name]["within"] = error is not None and abs(error) <= limit
        ok = row["after"]["within"]
        report.setdefault("metrics", {})[m] = {**row, "limit": limit}
        print(f"{m:20} {_f(measured[m]):>10} {_p(spread[m]):>7} {_f(row['before']['predicted']):>10} "
              f"{_p(row['before']['error']):>7} {_f(row['after']['predicted']):>10} {_p(row['after']['error']):>7}  "
              f"{'yes' if ok else 'NO'} (limit {limit:.0%})")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


def calibrate(args) -> int:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    if not args.params_only:
        subprocess.run([sys.executable, "-m", "coopsched.cli", "calibrate", "--target", args.url, "--out", args.out],
                       check=True, env=env)
    document = json.loads(Path(args.out).read_text())
    server = target.Server.connect(args.url)
    params, evidence, cost = server_params.fit_params("mlx-lm", server, document,
                                                      document["calibrated"]["fit"], print)
    calibrated = document.setdefault("calibrated", {})
    # what the cost-only twin priced, for the before column
    calibrated.setdefault("coopsched_terms", {k: document.get(k) for k in cost if k != "jitter_quantiles"})
    calibrated["coopsched_terms"].setdefault("jitter_quantiles", document.get("jitter_quantiles"))
    document.update(cost, server="mlx-lm", server_params=params)
    calibrated["server_fit"] = evidence
    Path(args.out).write_text(json.dumps(document, indent=1) + "\n")
    print(f"{args.out}: server mlx-lm, server_params {params}, cost terms {cost}")
    return 0


def ladder(args) -> int:
    for rate in [float(x) for x in args.rates.split(",")]:
        got = figures(live(args.url, workload(rate, args.requests), 0))
        print(f"rate {rate:g}/s: " + ", ".join(f"{m} {_f(got[m])}" for m in METRICS), flush=True)
    return 0


def _f(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def _p(x) -> str:
    return "-" if x is None else f"{x:+.0%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("calibrate")
    c.add_argument("url")
    c.add_argument("out")
    c.add_argument("--params-only", action="store_true", help="keep OUT's cost terms; fit the scheduler's")
    k = sub.add_parser("check")
    k.add_argument("url")
    k.add_argument("profile")
    k.add_argument("--rate", type=float, required=True)
    k.add_argument("--requests", type=int, default=40)
    k.add_argument("--runs", type=int, default=3)
    k.add_argument("--json")
    lad = sub.add_parser("ladder")
    lad.add_argument("url")
    lad.add_argument("--rates", default="4,8,16,32")
    lad.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    return {"calibrate": calibrate, "check": check, "ladder": ladder}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
