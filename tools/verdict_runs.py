"""Repeat the concurrency2 locust run, quiet or with the CPU kept busy, and tabulate its verdicts.

    python tools/verdict_runs.py [--slice-runs 20] [--burst-runs 10] [--busy 0,2] [--seconds 20]
                                        [--locustfile PATH --pythonpath DIR --label NAME] [--json OUT]

Each run is `locust -f concurrency2.py --headless -t S` on its own mock server; slice mode as
shipped, the legacy burst with MLXCEL_MTP_TICK_SLICE=0. `--busy N` starts N `while True: pass`
processes for the runs of that row (and always stops them). The margin is the worst classic gap
over the every-gap limit (> 1 means over it); a locust file without the stall rule (an older
checkout, through --locustfile and --pythonpath) is judged by its own verdict. Not a test: the
numbers depend on the machine; prints a table and the load averages, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

LOCUSTFILE = Path(__file__).resolve().parents[1] / "scenarios" / "concurrency2.py"


@contextmanager
def busy_loops(n: int):
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def one_run(locustfile: Path, pythonpath: str, mode: str, seconds: int, workdir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXCEL_")}
    env["PYTHONPATH"] = pythonpath
    if mode == "burst":
        env["MLXCEL_MTP_TICK_SLICE"] = "0"
    report_path = workdir / "report.json"
    report_path.unlink(missing_ok=True)
    load_before = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "--only-summary",
                           "-t", f"{seconds}s", "--report-json", str(report_path)], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=seconds + 120)
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    split = worst_gap_split(report)
    every = (report.get("stalls") or {}).get("every_gap") or {}
    gap_max, limit = report.get("classic_itl_max_ms"), report.get("gap_limit_ms")
    return {"mode": mode, "exit": proc.returncode, "verdict": report.get("verdict"), "server_mode": report.get("mode"),
            "gap_max_ms": gap_max, "gap_limit_ms": limit, "margin": gap_max / limit if gap_max and limit else None,
            "p99_ms": report.get("classic_itl_p99_ms"), "p99_limit_ms": report.get("p99_limit_ms"),
            "noise_gaps": every.get("noise"), "hol_gaps": every.get("hol"),
            "evidence_max": every.get("max_evidence_tokens"), "timeline": every.get("timeline"),
            "allowance": (every.get("worst_hol") or every.get("worst_noise") or {}).get("allowance_tokens"),
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2), **split,
            "tail": None if report else (proc.stdout + proc.stderr)[-1500:]}


def worst_gap_split(report: dict) -> dict:
    """Where the worst classic gap's time went: the engine's own gap (tick end to tick end) and what
    delivery (SSE, socket, the client) added to it; and the worst engine gap of the run."""
    worst, engine_max = None, None
    for r in report.get("per_request", []):
        times, ticks = r.get("token_times_ms") or [], r.get("tick_end_ms")
        if r.get("kind") != "classic" or not ticks:
            continue
        for i in range(1, len(times)):
            gap, engine = times[i] - times[i - 1], ticks[i] - ticks[i - 1]
            engine_max = engine if engine_max is None else max(engine_max, engine)
            if worst is None or gap > worst[0]:
                worst = (gap, engine)
    if worst is None:
        return {"worst_gap_engine_ms": None, "worst_gap_delivery_ms": None, "engine_gap_max_ms": None}
    return {"worst_gap_engine_ms": round(worst[1], 3), "worst_gap_delivery_ms": round(worst[0] - worst[1], 3),
            "engine_gap_max_ms": round(engine_max, 3)}


def row(label: str, mode: str, busy: int, runs: list[dict]) -> dict:
    margins = [r["margin"] for r in runs if r["margin"] is not None]
    loads = [r["load_before"] for r in runs] + [r["load_after"] for r in runs]
    evidence = [r["evidence_max"] for r in runs if r["evidence_max"] is not None]
    return {"label": label, "mode": mode, "busy": busy, "runs": len(runs),
            "fails": sum(r["verdict"] != "pass" for r in runs),
            "margin_worst": max(margins, default=None), "margin_median": float(np.median(margins)) if margins else None,
            "margin_best": min(margins, default=None),
            "p99_over_limit_worst": max((r["p99_ms"] / r["p99_limit_ms"] for r in runs
                                         if r["p99_ms"] and r["p99_limit_ms"]), default=None),
            "noise_gaps": sum(r["noise_gaps"] or 0 for r in runs), "hol_gaps": sum(r["hol_gaps"] or 0 for r in runs),
            "evidence_range": [min(evidence), max(evidence)] if evidence else None,
            "allowance": next((r["allowance"] for r in runs if r["allowance"] is not None), None),
            "load_range": [min(loads), max(loads)],
            "engine_gap_max_ms": max((r["engine_gap_max_ms"] for r in runs if r.get("engine_gap_max_ms")),
                                     default=None),
            "per_run": runs}


def print_table(rows: list[dict]) -> None:
    f = lambda v, d=2: "-" if v is None else f"{v:.{d}f}"
    print("| code | mode | busy loops | runs | verdict fail | worst gap / limit: worst, median, best | "
          "p99 / limit, worst | gaps over the limit: noise / HOL | most tokens in one gap (allowed) | load average |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ev = "-" if r["evidence_range"] is None else f"{r['evidence_range'][0]}-{r['evidence_range'][1]}"
        ev += f" ({r['allowance'] or '-'})"
        print(f"| {r['label']} | {r['mode']} | {r['busy']} | {r['runs']} | {r['fails']} | "
              f"{f(r['margin_worst'])}, {f(r['margin_median'])}, {f(r['margin_best'])} | "
              f"{f(r['p99_over_limit_worst'])} | {r['noise_gaps']} / {r['hol_gaps']} | {ev} | "
              f"{r['load_range'][0]:.1f}-{r['load_range'][1]:.1f} |", flush=True)


def print_split(rows: list[dict]) -> None:
    """Slice runs with tick stamps: the worst classic gap of each run, split into engine and delivery."""
    print("\n| code | busy loops | worst classic gap of each run (ms) = engine gap + delivery, over the runs |")
    print("|---|---|---|")
    for r in rows:
        runs = [x for x in r["per_run"] if x.get("worst_gap_engine_ms") is not None]
        if r["mode"] != "slice" or not runs:
            continue
        parts = ", ".join(f"{x['gap_max_ms']:.0f} = {x['worst_gap_engine_ms']:.0f} + {x['worst_gap_delivery_ms']:.0f}"
                          for x in sorted(runs, key=lambda x: -x["gap_max_ms"]))
        print(f"| {r['label']} | {r['busy']} | {parts} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/verdict_runs.py", description=__doc__.splitlines()[0])
    parser.add_argument("--slice-runs", type=int, default=20)
    parser.add_argument("--burst-runs", type=int, default=10)
    parser.add_argument("--busy", default="0,2", help="busy-loop counts, one row each (default 0,2)")
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--locustfile", type=Path, default=LOCUSTFILE)
    parser.add_argument("--pythonpath", default=str(LOCUSTFILE.parents[1]),
                        help="the checkout the locust file and its server import (default: this one)")
    parser.add_argument("--label", default="stall rule")
    parser.add_argument("--json", type=Path, default=Path("reports/verdict-runs.json"))
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for busy in (int(b) for b in args.busy.split(",")):
            for mode, count in (("slice", args.slice_runs), ("burst", args.burst_runs)):
                if not count:
                    continue
                runs = []
                with busy_loops(busy):
                    for i in range(count):
                        runs.append(one_run(args.locustfile, args.pythonpath, mode, args.seconds, Path(tmp)))
                        r = runs[-1]
                        print(f"  {args.label} {mode} busy={busy} run {i + 1}/{count}: {r['verdict']} gap max "
                              f"{r['gap_max_ms']} / {r['gap_limit_ms']} p99 {r['p99_ms']} noise {r['noise_gaps']} "
                              f"hol {r['hol_gaps']} evidence {r['evidence_max']} load {r['load_before']}",
                              file=sys.stderr, flush=True)
                rows.append(row(args.label, mode, busy, runs))
                time.sleep(1)
    print_table(rows)
    print_split(rows)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
