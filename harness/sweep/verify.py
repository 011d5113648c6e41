"""`sweep --cost PROFILE --target URL`: the twin is swept in virtual time, and N of its points run on
the server too: seed 0 (the same workload draw both ways), the server's mode, at loads evenly spread
over the swept ones (lowest and highest first); a server that reports no mode is verified
against the default mode's points. The sweep JSON's `verified` holds, per point,
{metric: {predicted, measured, error}} with error = predicted / measured - 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from harness.sweep.points import SweepError, Task

DEFAULT_POINTS = 2
METRICS = ("aggregate_tok_s", "ttft_p50_ms", "ttft_p95_ms", "classic_itl_p99_ms", "itl_p99_ms", "slo_attainment")


def spread_loads(loads: Sequence[int | float], count: int) -> list[int | float]:
    """`count` of the ascending loads, evenly spread, the highest always in (one point: the highest)."""
    if count >= len(loads):
        return list(loads)
    if count == 1:
        return [loads[-1]]
    return [loads[round(i * (len(loads) - 1) / (count - 1))] for i in range(count)]


def key(mode: str, load: int | float) -> str:
    return f"{mode}@{load:g}"


def errors(predicted: dict, measured: dict) -> dict:
    out = {}
    for metric in METRICS:
        p, m = predicted.get(metric), measured.get(metric)
        out[metric] = {"predicted": p, "measured": m,
                       "error": round(p / m - 1, 4) if p is not None and m else None}
    return out


class Verifier:
    """The live server behind a twin sweep; `run` measures the chosen points on it."""

    def __init__(self, url: str, count: int) -> None:
        from harness.sweep.live import Server

        self.server = Server(url)
        self.count = count
        self.mode: str | None = None

    def check_modes(self, modes: Sequence[str], default: str) -> None:
        """The verified points are in the server's mode: the twin must sweep it (a server that
        reports no mode: the default mode stands for it when swept, else the first swept)."""
        if self.server.reports_mode and self.server.mode not in modes:
            raise SweepError(f"--mode {','.join(modes)}: the server at {self.server.url} runs {self.server.mode} "
                             "(its /health says so), and its points are verified against the twin's in that "
                             "mode; add it or leave --mode out")
        self.mode = self.server.mode if self.server.reports_mode else default if default in modes else modes[0]

    def pick(self, tasks: Sequence[Task]) -> list[Task]:
        loads = sorted({t.load for t in tasks})
        chosen = set(spread_loads(loads, self.count))
        return [t for t in tasks if t.mode == self.mode and t.seed == 0 and t.load in chosen]

    def run(self, tasks: Sequence[Task], done: Sequence[dict]) -> dict:
        """{"verified": {MODE@LOAD: {mode, load, seed, metrics}}, "target": URL} for the sweep JSON."""
        from harness.sweep.live import run_live_point, warm

        picked = self.pick(tasks)
        if picked:
            warm(self.server, picked[0])
        verified = {}
        for task in picked:
            live = run_live_point(self.server, replace(task, config=None))
            verified[key(task.mode, task.load)] = {"mode": task.mode, "load": task.load, "seed": task.seed,
                                                   "metrics": errors(done[task.index], live)}
        return {"target": self.server.url, "verified": verified}


def print_verified(console, sweep: dict) -> None:
    from rich.table import Table

    table = Table(title=f"the twin vs {sweep['target']} at {len(sweep['verified'])} point(s), live once each "
                        "(error = predicted / measured - 1)", box=None, pad_edge=False, padding=(0, 1),
                  header_style="bold")
    for col in ("point", "metric", "predicted", "measured", "error"):
        table.add_column(col, justify="left" if col in ("point", "metric") else "right", no_wrap=True)
    num = lambda v: "-" if v is None else f"{v:.2f}"
    for name, entry in sweep["verified"].items():
        for metric, row in entry["metrics"].items():
            table.add_row(name, metric, num(row["predicted"]), num(row["measured"]),
                          "-" if row["error"] is None else f"{row['error']:+.1%}")
        table.add_section()
    console.print(table)
