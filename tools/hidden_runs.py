"""Repeat `run concurrency2 --target` and locust against `coopsched serve` behind the hiding proxy.

    python tools/hidden_runs.py --mode burst|slice [--costs fast|default] [--target-runs 10]
                                [--locust-runs 3] [--busy 0] [--out reports/hidden-runs]

The server and the proxy (tests/e2e/hiding_proxy.py: bare /health, no tick stamps) run on CPU 0,
the clients on CPU 1, as in tests/e2e/test_hidden_server.py; `--busy N` keeps N `while True: pass`
loops running beside them. Each trace and report is kept whole (raw arrivals, for replaying a rule)
with the load average before it; one line per run says the verdict. Not a test: numbers depend on
the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

from verdict_runs import busy_loops

from harness.live.client import spawn_server

ROOT = Path(__file__).resolve().parents[1]

PROXY = ROOT / "tests" / "e2e" / "hiding_proxy.py"
LOCUSTFILE = ROOT / "scenarios" / "concurrency2.py"
COSTS = {"default": ("5", "30"), "fast": ("0.3", "1.5")}


def clean_env(**gates: str) -> dict:
    """The environment without the caller's MLXCEL_* gates, plus `gates`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("MLXCEL_")}, **gates}


def serve(command: list[str], env: dict):
    return spawn_server(command=command, env=env)


def pinned(cpu: str, command: list[str]) -> list[str]:
    return ["taskset", "-c", cpu, *command]


def target_run(url: str, path: Path, env: dict) -> str:
    load = os.getloadavg()[0]
    proc = subprocess.run(pinned("1", [sys.executable, "-m", "coopsched.cli", "run", "concurrency2", "--target", url,
                                       "--json", str(path)]), capture_output=True, text=True, env=env, timeout=300)
    trace = json.loads(path.read_text())[0]
    trace.update(_load=load, _exit=proc.returncode)
    path.write_text(json.dumps(trace))
    stall = next(c for c in trace["checks"] if c["name"] == "stall_vs_solo")
    worst = (stall.get("stalls") or {}).get("worst_hol") or (stall.get("stalls") or {}).get("worst_noise") or {}
    return (f"exit {proc.returncode} load {load:.2f}: worst gap {stall.get('value')} vs {stall.get('bound')}; "
            f"worst over: {worst.get('measure')} {worst.get('evidence_tokens')} vs {worst.get('allowance_tokens')} "
            f"({worst.get('verdict')})")


def locust_run(url: str, path: Path, env: dict, seconds: int) -> str:
    load = os.getloadavg()[0]
    proc = subprocess.run(pinned("1", [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
                                       "--only-summary", "-t", f"{seconds}s", "--host", url, "--report-json",
                                       str(path)]), capture_output=True, text=True, env=env, timeout=seconds + 200,
                          cwd=path.parent)
    report = json.loads(path.read_text())
    report.update(_load=load, _exit=proc.returncode)
    path.write_text(json.dumps(report))
    waits = (report.get("stalls") or {}).get("waits") or {}
    return (f"exit {proc.returncode} load {load:.2f}: {report.get('verdict')}, hol {waits.get('hol')}, "
            f"noise {waits.get('noise')}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/hidden_runs.py", description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("burst", "slice"), required=True)
    parser.add_argument("--costs", choices=tuple(COSTS), default="fast")
    parser.add_argument("--target-runs", type=int, default=10)
    parser.add_argument("--locust-runs", type=int, default=3)
    parser.add_argument("--locust-seconds", type=int, default=6)
    parser.add_argument("--busy", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("reports/hidden-runs"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    decode, round_ms = COSTS[args.costs]
    env = clean_env(PYTHONPATH=str(ROOT))
    gates = clean_env(PYTHONPATH=str(ROOT), MLXCEL_MTP_TICK_SLICE="0" if args.mode == "burst" else "1")
    label = f"{args.mode}-{args.costs}-busy{args.busy}"
    with ExitStack() as stack:
        stack.enter_context(busy_loops(args.busy))
        served = stack.enter_context(serve(command=pinned("0", [sys.executable, "-m", "coopsched.cli", "serve",
                                                                "--host", "127.0.0.1", "--port", "0", "--decode-ms",
                                                                decode, "--round-ms", round_ms]), env=gates))
        proxy = stack.enter_context(serve(command=pinned("0", [sys.executable, str(PROXY), "--upstream", served.url]),
                                          env=env))
        for i in range(args.target_runs):
            print(f"target {label} {i}: {target_run(proxy.url, args.out / f'target-{label}-{i}.json', env)}",
                  flush=True)
        for i in range(args.locust_runs):
            line = locust_run(proxy.url, (args.out / f"locust-{label}-{i}.json").resolve(), env, args.locust_seconds)
            print(f"locust {label} {i}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
