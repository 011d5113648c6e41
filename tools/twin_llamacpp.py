"""llama-server live vs its twins on held-out open-loop workloads, without and with a draft model.

    python tools/twin_llamacpp.py --binary .tox/llama-server/build/bin/llama-server --out reports/llamacpp/twin.json

Per config: start llama-server pinned to the last core, `coopsched calibrate --target` it (the
profile, with the detected kind and fitted server params), find the knee with a short live ladder
of Poisson rates, then run a light and a near-knee workload (half the requests speculative, lengths
unlike the calibration's) live RUNS times and on two twins: before (the coopsched kind, the cost
profile alone) and after (the llama.cpp kind). Prints per metric predicted, measured (the mean of
the live runs), error and the live runs' own spread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.calibrate import server_params, target, twin  # noqa: E402
from harness.calibrate.detect import detect_kind  # noqa: E402
from harness.calibrate.llamacpp_check import (  # noqa: E402
    TARGETS,
    error_row,
    figures,
    live,
    mean_counters,
    run_figures,
    simulate,
    twins,
    workload,
)
from harness.live.client import free_port, spawn_server  # noqa: E402

SERVER_ARGS = ("--host", "127.0.0.1", "--parallel", "4", "-c", "4096", "-t", "1", "--metrics")
CONFIGS = {"no-draft": (), "draft": ("-md", "{draft}", "--spec-type", "draft-simple", "--spec-draft-n-max", "3")}
CPUS = sorted(os.sched_getaffinity(0))
PINNED = len(CPUS) > 1 and shutil.which("taskset") is not None
SERVER_CPU, CLIENT_CPUS = CPUS[-1], ",".join(map(str, CPUS[:-1]))
LADDER_RATES = (5.0, 10.0, 20.0, 40.0, 80.0)
LADDER_REQUESTS = 40
QUIET_LOAD, QUIET_WAIT_S = 3.0, 45.0  # a live run waits (at most this long) for the machine to quieten


def quiet() -> None:
    """Wait, bounded, for the 1-minute load average to drop under QUIET_LOAD (a shared machine)."""
    deadline = time.monotonic() + QUIET_WAIT_S
    while os.getloadavg()[0] > QUIET_LOAD and time.monotonic() < deadline:
        time.sleep(3)


def on_cpus(cpus, command: list[str]) -> list[str]:
    return ["taskset", "-c", str(cpus), *command] if PINNED else command


def knee(server: target.Server) -> tuple[float, list[dict]]:
    """The highest ladder rate the server still keeps up with (achieved within 10% of offered
    requests per second and TTFT p50 under 4x the lightest rung's); the ladder's rows."""
    rows, best, base = [], LADDER_RATES[0], None
    for rate in LADDER_RATES:
        n = max(LADDER_REQUESTS, int(rate * 3))  # 3 s of arrivals: the drain is a small part of the span
        scenario = workload(rate, n)
        run = live(server, scenario, 1, seed=100)[0]
        f = run_figures([run])
        span_s = (max(r["token_times_ms"][-1] for r in run) - min(r["arrival_ms"] for r in run)) / 1000
        offered = (n - 1) / (max(r["arrival_ms"] for r in run) / 1000)
        achieved = n / span_s
        base = base or f["ttft_p50_ms"]
        rows.append({"rate_per_s": rate, "offered": offered, "achieved": achieved, **f})
        if achieved < 0.8 * offered or f["ttft_p50_ms"] > 4 * base:
            break
        best = rate
    return best, rows


def start(binary: Path, gguf: Path, extra: tuple[str, ...]):
    port = free_port()
    command = [str(binary), "-m", str(gguf), "--port", str(port), *SERVER_ARGS, *extra]
    return spawn_server(command=on_cpus(SERVER_CPU, command), port=port, timeout_s=120)


def calibrate(url: str, out: Path) -> dict:
    """`calibrate --target`, then the kind and server params (written here if calibrate did not)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(on_cpus(CLIENT_CPUS, [sys.executable, "-m", "coopsched.cli", "calibrate", "--target", url,
                                                "--out", str(out), "--max-batch", "4"]),
                          capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"calibrate failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    print(proc.stdout)
    profile = json.loads(out.read_text())
    kind, why = detect_kind(url)
    if kind != "llama.cpp":
        raise SystemExit(f"{url} was detected as {kind} ({why}), not llama.cpp")
    evidence = server_params.llamacpp.calibrate_llamacpp(profile, target.Server.connect(url))
    out.write_text(json.dumps(profile, indent=1) + "\n")
    print(f"kind {kind}: {why}\n" + "\n".join(evidence))
    return profile


def print_table(config: str, name: str, measured: dict, twins: dict) -> None:
    print(f"\n== {config} / {name}: live {len(measured['runs'])} runs vs twins")
    print(f"{'metric':<20}{'live':>10}{'spread':>8}" + "".join(f"{k:>17}{'err':>8}" for k in twins))
    for metric in TARGETS:
        m = measured["pooled"][metric]
        line = f"{metric:<20}{_f(m):>10}{_pct(measured['spread'].get(metric)):>8}"
        for rows in twins.values():
            row = rows[metric]
            mark = "" if row["within"] else "*"
            line += f"{_f(row['predicted']):>17}{_pct(row['error']) + mark:>8}"
        print(line)


def _f(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.0%}"


def export_models(out: Path) -> tuple[Path, Path]:
    from coopsched import cli
    from coopsched.backends.model_build import ensure_tiny_models

    target_dir, draft_dir = ensure_tiny_models()
    for name, source in (("target", target_dir), ("draft", draft_dir)):
        if not (out / f"{name}.gguf").exists():
            assert cli.main(["model", "export", "--format", "gguf", "--out", str(out / f"{name}.gguf"),
                             "--from", str(source)]) == 0
    return out / "target.gguf", out / "draft.gguf"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/twin-llamacpp"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=5, help="twin runs per workload (draws)")
    parser.add_argument("--configs", default="no-draft,draft")
    parser.add_argument("--reuse", action="store_true", help="reuse a config's profile in --work")
    parser.add_argument("--rate", type=float, help="the knee's rate (requests/s): skip the ladder")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    target_gguf, draft_gguf = export_models(args.work)
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    for config in args.configs.split(","):
        extra = tuple(a.replace("{draft}", str(draft_gguf)) for a in CONFIGS[config])
        with start(args.binary, target_gguf, extra) as served:
            profile_path = args.work / f"{config}.json"
            if args.reuse and profile_path.exists():
                profile = json.loads(profile_path.read_text())
            else:
                quiet()
                profile = calibrate(served.url, profile_path)
            server = target.Server.connect(served.url)
            speculates = profile["calibrated"]["fit"]["speculates"]
            models = twins(profile_path, server, speculates)
            rate, ladder = knee(server) if args.rate is None else (args.rate, [])
            out = {"profile": {k: profile.get(k) for k in ("server", "server_params")},
                   "evidence": profile["calibrated"].get("server_fit"), "knee_rate_per_s": rate,
                   "ladder": ladder, "workloads": {}}
            for name, r in (("light", rate / 4), ("knee", rate)):
                scenario = workload(r)
                if not speculates:  # a server without a drafter serves every request classic
                    scenario = twin.classic(scenario)
                books: list = []
                measured = figures(live(server, scenario, args.runs, counters=books, before_run=quiet))
                measured["load_average"] = [round(x, 2) for x in os.getloadavg()]
                rows, steps = {}, {"live": mean_counters(books)}
                for kind, (p, c) in models.items():
                    runs, counted = simulate(p, scenario, c, range(args.seeds))
                    rows[kind], steps[kind] = error_row(figures(runs), measured), mean_counters(counted)
                out["workloads"][name] = {"rate_per_s": r, "measured": measured, "twins": rows, "steps": steps,
                                          "load_average": os.getloadavg()[0]}
                print_table(config, f"{name} ({r:g} req/s)", measured, rows)
                for who, c in steps.items():
                    print(f"  {who:<10} " + ", ".join(f"{k} {v:.2f}" for k, v in c.items()))
        results[config] = out
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
