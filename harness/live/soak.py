"""Soak: locust (scenarios/soak.py) against a mock `coopsched serve` while its RSS is watched.

    python -m harness.live.soak [--users 64] [--duration 300] [--warmup 30] [--report PATH]

Passes iff locust saw zero failures, the server's RSS grew less than --max-rss-growth
from the end of the warm-up to the end of the load, the server was idle afterwards
(no slot, no running or waiting request) and exited 0 on SIGTERM. Prints a table
and writes a JSON report. The tox env `soak` runs it (not part of the default run).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.live import client
from harness.verdict.check import Check

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "soak.py"
DEFAULT_REPORT = Path("reports/soak/latest.json")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.live.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=64)
    parser.add_argument("--spawn-rate", type=float, default=16)
    parser.add_argument("--duration", type=int, default=300, help="seconds of load (default 300)")
    parser.add_argument("--warmup", type=int, default=30, help="seconds before the RSS baseline (default 30)")
    parser.add_argument("--max-rss-growth", type=float, default=0.10, help="allowed fraction (default 0.10)")
    parser.add_argument("--decode-ms", default="5")
    parser.add_argument("--round-ms", default="30")
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT)
    return parser.parse_args(argv)


def wait_until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def is_idle(url: str) -> bool:
    m = client.scrape_metrics(url)
    return (m["coopsched_kv_slots_in_use"], m["coopsched_requests_running"],
            m["coopsched_requests_waiting"]) == (0, 0, 0)


def locust_stats(prefix: str) -> list[dict]:
    with open(f"{prefix}_stats.csv", newline="") as f:
        return list(csv.DictReader(f))


def run(args) -> dict:
    import psutil

    serve_args = ["--decode-ms", args.decode_ms, "--round-ms", args.round_ms, "--log-level", "warning"]
    with client.spawn_server(serve_args) as server:
        url = server.url
        rss = psutil.Process(server.proc.pid).memory_info
        idle_rss = rss().rss
        with tempfile.TemporaryDirectory() as tmp:
            prefix = f"{tmp}/soak"
            locust = subprocess.Popen(
                [sys.executable, "-m", "locust", "-f", str(SCENARIO), "--headless", "-u", str(args.users),
                 "-r", str(args.spawn_rate), "-t", f"{args.duration}s", "--host", url, "--csv", prefix,
                 "--only-summary", "--stop-timeout", "30", "--loglevel", "WARNING"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            began, samples = time.monotonic(), []
            while locust.poll() is None:
                samples.append((time.monotonic() - began, rss().rss))
                time.sleep(2.0)
            locust_err = locust.stderr.read()
            rows = locust_stats(prefix)
        is_quiet = wait_until(lambda: is_idle(url), 30)
        loaded = [s for s in samples if args.warmup <= s[0] <= args.duration] or samples
        server_rc = server.stop(timeout_s=60)  # SIGTERM: a clean exit is part of the verdict
        log = server.log
    baseline, final = loaded[0][1], loaded[-1][1]
    total = next(r for r in rows if r["Name"] == "Aggregated")
    return {
        "users": args.users, "duration_s": args.duration, "warmup_s": args.warmup,
        "requests": int(total["Request Count"]), "failures": int(total["Failure Count"]),
        "requests_per_s": float(total["Requests/s"]), "p50_ms": float(total["50%"] or 0),
        "p95_ms": float(total["95%"] or 0), "p99_ms": float(total["99%"] or 0),
        "by_name": {r["Name"]: {"requests": int(r["Request Count"]), "failures": int(r["Failure Count"]),
                                "p95_ms": float(r["95%"] or 0)} for r in rows if r["Name"] != "Aggregated"},
        "rss_idle_mb": idle_rss / 2**20, "rss_baseline_mb": baseline / 2**20, "rss_final_mb": final / 2**20,
        "rss_max_mb": max(s[1] for s in loaded) / 2**20, "rss_growth": (final - baseline) / baseline,
        "rss_samples_mb": [[round(t, 1), round(b / 2**20, 2)] for t, b in samples],
        "idle_after": is_quiet, "server_exit_code": server_rc, "locust_exit_code": locust.returncode,
        "locust_stderr_tail": locust_err[-2000:], "server_log_tail": "".join(log[-20:])[-2000:],
    }


def checks(report: dict, max_growth: float) -> list[Check]:
    """The soak's verdict as checks; a failed one's note says what went wrong."""
    growth, code, n = report["rss_growth"], report["server_exit_code"], report["requests"]
    failed = report["failures"]
    idle = bool(report["idle_after"])
    return [Check("failures", failed == 0, failed, 0, note=f"{failed} failed requests"),
            Check("rss_growth", growth < max_growth, growth, max_growth,
                  note=f"RSS grew {growth:.1%} (limit {max_growth:.0%})"),
            Check("idle_after", idle, idle, True, note="idle after the load" if idle else
                  "the server still held slots or requests after the load"),
            Check("server_exit", code == 0, code, 0, note=f"the server exited {code} on SIGTERM"),
            Check("requests", n > 0, n, 1, note=f"{n} requests made" if n else "no requests were made")]


def verdict(report: dict, max_growth: float) -> list[str]:
    """What went wrong, one line each (none: the soak passed)."""
    return [c.note for c in checks(report, max_growth) if not c.ok]


def print_table(report: dict, problems: list[str], max_growth: float) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"soak: {report['users']} users x {report['duration_s']} s on the mock server")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("limit", justify="right")
    rows = [("requests", f"{report['requests']}", ""), ("failures", f"{report['failures']}", "0"),
            ("requests/s", f"{report['requests_per_s']:.1f}", ""),
            ("latency p50 / p95 / p99 ms", f"{report['p50_ms']:.0f} / {report['p95_ms']:.0f} / "
                                           f"{report['p99_ms']:.0f}", ""),
            ("RSS idle MB", f"{report['rss_idle_mb']:.1f}", ""),
            (f"RSS after {report['warmup_s']} s warm-up MB", f"{report['rss_baseline_mb']:.1f}", ""),
            ("RSS at end of load MB", f"{report['rss_final_mb']:.1f}", ""),
            ("RSS max under load MB", f"{report['rss_max_mb']:.1f}", ""),
            ("RSS growth", f"{report['rss_growth']:+.1%}", f"< {max_growth:.0%}"),
            ("idle after the load", str(report["idle_after"]), "True"),
            ("server exit code on SIGTERM", str(report["server_exit_code"]), "0")]
    rows += [(f"  {name}", f"{v['requests']} req, {v['failures']} failed, p95 {v['p95_ms']:.0f} ms", "")
             for name, v in sorted(report["by_name"].items())]
    for row in rows:
        table.add_row(*row)
    console = Console()
    console.print(table)
    console.print("[green]soak passed[/]" if not problems else f"[red]soak failed:[/] {'; '.join(problems)}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    judged = checks(report, args.max_rss_growth)
    problems = [c.note for c in judged if not c.ok]
    report["ok"] = not problems
    report["problems"] = problems
    report["checks"] = [c.to_json() for c in judged]
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=1) + "\n")
    print_table(report, problems, args.max_rss_growth)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
