"""`coopsched sweep NAME|PATH`: a workload at several loads x modes x seeds, judged by a per-token SLO.

Each point runs the scenario's [workload] at one rate (--rates, open loop) or one number of
users (--concurrency, closed loop), in one mode, with one seed, and keeps its latency,
throughput and SLO attainment; each mode's capacity is the highest load at which it and every
lower load keep the mean attainment over seeds >= --attainment. Exit 0 when every point ran
(a null capacity is a result); 2, with one line, when the sweep could not run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from coopsched.core import MODES
from harness.run import runner, scenario
from harness.run import slo as slo_module
from harness.run.scenario import Scenario
from harness.run.slo import Slo
from harness.sweep import dispatch, points, verify
from harness.sweep.points import SweepError

DEFAULT_SLO = slo_module.parse_slo(slo_module.DEFAULT_SLO)
DEFAULT_SEEDS = 3  # capacity is a mean over seeds: one Poisson draw can flatter or punish a load
STORE = Path("reports") / "sweeps" / "latest.json"  # every finished sweep; `coopsched report` shows it
ROUNDS, SLICES = "coopsched_spec_rounds_total", "coopsched_spec_slices_total"
# the /metrics counters a live table shows per rung, those any rung has: coopsched's, llama.cpp's
LIVE_COLUMNS = ((ROUNDS, "rounds"), (SLICES, "slices"), ("llamacpp:spec_decode_num_drafts_total", "drafts"),
                ("llamacpp:spec_decode_num_draft_tokens_total", "drafted"),
                ("llamacpp:spec_decode_num_accepted_tokens_total", "accepted"))
_WHOLE = re.compile(r"\+?[0-9]+")
_DECIMAL = re.compile(r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)")
EPILOG = f"""A point = one mode x one load x one seed (seeds 0..N-1, default {DEFAULT_SEEDS}); give exactly one of
--rates (open loop: the workload's rate_per_s; a replayed trace's speedup) and --concurrency (closed loop of
that many users; a trace's requests in file order, its arrivals ignored).
A request meets the SLO iff TTFT <= ttft_ms and EVERY inter-token gap <= itl_ms (never a mean);
capacity[mode] = the highest swept load whose mean attainment over seeds, and every lower load's,
is >= --attainment. --out DIR writes sweep.json, index.html and PNGs; every finished sweep is also
stored as {STORE} (relative to the working directory), which `coopsched report` shows."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("name", metavar="NAME|PATH", help="a shipped scenario or a scenario .toml with a [workload]")
    parser.add_argument("--rates", metavar="R1,R2,...",
                        help="open-loop rates to sweep (requests/s, > 0); for a replayed trace, speed-ups (2 = twice "
                             "as fast as the file)")
    parser.add_argument("--concurrency", metavar="C1,C2,...", help="closed-loop users to sweep (whole numbers >= 1)")
    parser.add_argument("--mode", metavar="burst|slice|fused|cost|all",
                        help="scheduler mode(s) (default all; with --target: the server's own)")
    parser.add_argument("--seeds", default=str(DEFAULT_SEEDS), metavar="N",
                        help=f"seeds 0..N-1 per mode x load (default {DEFAULT_SEEDS})")
    parser.add_argument("--slo", default=slo_module.DEFAULT_SLO, metavar="itl_ms=X,ttft_ms=Y",
                        help=f"the per-token SLO (default {slo_module.DEFAULT_SLO})")
    parser.add_argument("--attainment", default=str(slo_module.DEFAULT_ATTAINMENT), metavar="F",
                        help=f"share of requests that must meet the SLO (default {slo_module.DEFAULT_ATTAINMENT})")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the sweep JSON here")
    parser.add_argument("--out", type=Path, metavar="DIR", help="write sweep.json, index.html and PNG plots here")
    parser.add_argument("--jobs", metavar="J", help="local worker processes (default 1; same result for any J)")
    parser.add_argument("--cluster", metavar="tcp://HOST:PORT", help="run the points on this Dask scheduler")
    parser.add_argument("--target", metavar="URL", help="run each point in real time against this server")
    parser.add_argument("--cost", type=Path, metavar="PROFILE.json",
                        help="price the mock with this cost profile (coopsched calibrate): a server's digital twin")
    parser.add_argument("--verify-points", metavar="N",
                        help=f"with --cost and --target: run N of the twin's points live (loads evenly spread, "
                             f"seed 0, the server's mode) and record the twin's error there (default "
                             f"{verify.DEFAULT_POINTS})")
    parser.add_argument("--prefill-grant-interval", type=int, metavar="N",
                        help="slice, burst: decode ticks a chunked prompt yields before one chunk is granted, "
                             "0 never (wins over MLXCEL_PREFILL_GRANT_INTERVAL and the scenario's; default 16)")


@dataclass(frozen=True)
class Settings:
    scenario: Scenario
    load_kind: str                         # "rate" | "concurrency"
    loads: tuple[int | float, ...]         # ascending
    modes: tuple[str, ...] | None = None   # None: every mode (with --target: the server's)
    seeds: int = DEFAULT_SEEDS
    slo: Slo = DEFAULT_SLO
    attainment: float = slo_module.DEFAULT_ATTAINMENT
    jobs: int = 1
    cluster: str | None = None
    target: str | None = None
    cost: str | None = None                # the cost profile's path (the scenario is already priced by it)
    verify_points: int = 0                 # with cost and target: twin points run live


def parse_loads(option: str, text: str) -> tuple[int | float, ...]:
    """'2,4,6.5' -> (2, 4, 6.5), ascending; whole numbers stay ints; duplicates refused."""
    whole = option == "--concurrency"
    accepted = "whole numbers >= 1 (users), e.g. 1,2,4,8" if whole else "decimal numbers > 0 (requests/s), e.g. 2,4,8"
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or not all(items):
        raise SweepError(f"{option} {text!r} has an empty item; want a comma list of {accepted}")
    loads: list[int | float] = []
    for item in items:
        pattern = _WHOLE if whole else _DECIMAL
        if not pattern.fullmatch(item) or float(item) <= 0:
            raise SweepError(f"{option} item {item!r}: want {accepted}")
        value = float(item)
        load = int(value) if value.is_integer() else value
        if load in loads:
            raise SweepError(f"{option} names {item} twice")
        loads.append(load)
    return tuple(sorted(loads))


def parse_count(option: str, text: str) -> int:
    if not _WHOLE.fullmatch(text.strip()) or int(text) < 1:
        raise SweepError(f"{option} {text!r}: want a whole number >= 1")
    return int(text)


def settings_from(args: argparse.Namespace) -> Settings:
    """Every option checked before anything runs; SweepError (or the scenario's error) names the value."""
    if (args.rates is None) == (args.concurrency is None):
        given = "both" if args.rates is not None else "neither"
        raise SweepError(f"give exactly one of --rates R1,R2,... (open loop, requests/s) and --concurrency "
                         f"C1,C2,... (closed loop, users); got {given}")
    kind, option, text = (("rate", "--rates", args.rates) if args.rates is not None
                          else ("concurrency", "--concurrency", args.concurrency))
    loads = parse_loads(option, text)
    modes = None
    if args.mode is not None:
        if args.mode not in (*MODES, "all"):
            raise SweepError(f"--mode {args.mode!r}: want one of {', '.join(MODES)} or all")
        modes = MODES if args.mode == "all" else (args.mode,)
    jobs = parse_count("--jobs", args.jobs) if args.jobs is not None else 1
    if args.target and (args.cluster or jobs > 1):
        raise SweepError(f"--target {args.target} runs the points one at a time against one server: "
                         f"drop {'--cluster' if args.cluster else '--jobs'}")
    if args.cluster:
        dispatch.check_address(args.cluster)
        if jobs > 1:
            raise SweepError(f"--jobs {jobs} with --cluster: the cluster's workers run the points; drop --jobs")
    if args.out is not None:
        try:
            import matplotlib  # noqa: F401 - only checked here, used by the sweep page
        except ImportError:
            raise SweepError("--out draws its PNGs with matplotlib: pip install -e '.[bench]'") from None
    scen = scenario.load(args.name)
    points.check_sweepable(scen, kind)
    for warning in runner.gate_warnings([scen]):  # the configs are built here, from this environment
        print(f"warning: {warning}", file=sys.stderr)
    for note in scen.workload.notes if scen.workload else ():  # rows a replayed trace left out
        print(f"note: {note}", file=sys.stderr)
    verify_points = 0
    if args.verify_points is not None and not (args.cost and args.target):
        raise SweepError(f"--verify-points {args.verify_points} runs some of a twin's points live: give it with "
                         "both --cost PROFILE.json (the twin) and --target URL (the server)")
    if args.cost is not None:
        if args.target:  # the twin is swept; a few of its points are run on the server too
            verify_points = parse_count("--verify-points", args.verify_points or str(verify.DEFAULT_POINTS))
        profile = runner.Profile.load(args.cost)
        scen = runner.priced(scen, profile)
        if profile.note:
            print(f"note: {profile.note}", file=sys.stderr)
    if args.prefill_grant_interval is not None:
        if args.target:
            raise SweepError(f"--prefill-grant-interval {args.prefill_grant_interval} sets the virtual-time "
                             "scheduler, and a --target sweep measures the server's own: drop one")
        scen = replace(scen, scheduler={**scen.scheduler, "prefill_grant_interval": args.prefill_grant_interval})
    return Settings(scen, kind, loads, modes, parse_count("--seeds", args.seeds), slo_module.parse_slo(args.slo),
                    slo_module.parse_attainment(args.attainment), jobs, args.cluster, args.target,
                    None if args.cost is None else str(args.cost), verify_points)


class Sweep:
    """A planned sweep: the constructor refuses what cannot run (before any point), `run` runs it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = s = settings
        self.server = None
        self.verifier: verify.Verifier | None = None
        if s.target and s.cost:
            self.verifier = verify.Verifier(s.target, s.verify_points)
            modes = s.modes or MODES
            self.tasks = points.plan(s.scenario, s.load_kind, s.loads, modes, s.seeds, s.slo)
            self.verifier.check_modes(modes, runner.scenario_config(s.scenario, None).mode)
        elif s.target:
            from harness.sweep.live import Server

            self.server = Server(s.target)
            if s.modes is not None and s.modes != (self.server.mode,):
                runs = (f"runs {self.server.mode} (its /health says so)" if self.server.reports_mode else
                        "reports no mode (its /health has no `mode`), so its points are labelled external")
                raise SweepError(f"--mode {','.join(s.modes)}: the server at {s.target} {runs}, and a --target "
                                 "sweep measures the server as it runs; leave --mode out")
            self.tasks = points.plan(s.scenario, s.load_kind, s.loads, (self.server.mode,), s.seeds, s.slo,
                                     configs={self.server.mode: None})
        else:
            self.tasks = points.plan(s.scenario, s.load_kind, s.loads, s.modes or MODES, s.seeds, s.slo)

    def run(self, on_done: dispatch.OnDone | None = None) -> dict:
        s = self.settings
        if self.server is not None:
            from harness.sweep.live import run_live

            done = run_live(self.tasks, self.server, on_done)
        elif s.cluster:
            done = dispatch.run_cluster(self.tasks, s.cluster, on_done)
        else:
            done = dispatch.run_local(self.tasks, s.jobs, on_done)
        out = result(s, done, self.server.url if self.server else None)
        if self.verifier is not None:
            out.update(self.verifier.run(self.tasks, done))
        return out


def result(s: Settings, done: list[dict], target: str | None = None) -> dict:
    """The sweep JSON: nothing in it depends on where or how fast the points ran."""
    out = {"scenario": s.scenario.name, "load_kind": s.load_kind, "slo": s.slo.to_json(), "attainment": s.attainment,
           "clock": "real" if target else "virtual", "modes": list(dict.fromkeys(p["mode"] for p in done)),
           "loads": list(s.loads), "seeds": s.seeds}
    if target:
        out["target"] = target
    if s.cost:
        out["cost_profile"] = s.cost
    if s.load_kind == "rate" and s.scenario.workload is not None and s.scenario.workload.trace:
        out["load_unit"] = "speedup"  # a replayed trace: each rate is how many times faster than the file
    return {**out, "points": done, "summary": points.summary(done), "capacity": points.capacity(done, s.attainment)}


def dumps(sweep: dict) -> str:
    return json.dumps(sweep, indent=1) + "\n"


# -- the terminal ---------------------------------------------------------------------------
def unit(sweep: dict) -> str:
    if sweep.get("load_unit") == "speedup":
        return "x"
    return "req/s" if sweep["load_kind"] == "rate" else "users"


def capacity_line(sweep: dict) -> str:
    parts = [f"{mode} {'none' if load is None else f'{load:g} {unit(sweep)}'}" for mode, load in
             sweep["capacity"].items()]
    return (f"capacity (highest load at which it and every lower load keep a mean attainment >= "
            f"{sweep['attainment']:g}): " + ", ".join(parts))


def live_columns(sweep: dict) -> list[tuple[str, str]]:
    """(counter, column) of LIVE_COLUMNS some rung's metrics_delta has; coopsched's two when none
    does (a live sweep shows "-" there); none for a virtual-time sweep."""
    deltas = [row.get("metrics_delta") or {} for rows in sweep["summary"].values() for row in rows
              if "metrics_delta" in row]
    seen = [(name, label) for name, label in LIVE_COLUMNS if any(name in d for d in deltas)]
    return seen or (list(LIVE_COLUMNS[:2]) if deltas else [])


def print_table(console: Console, sweep: dict) -> None:
    slo = Slo(**sweep["slo"])
    live = live_columns(sweep)
    table = Table(title=escape(f"coopsched sweep {sweep['scenario']} ({sweep['clock']} time, "
                               f"{len(sweep['points'])} points): means over {sweep['seeds']} seed(s); SLO: "
                               f"{slo.describe()}; attain = share of requests meeting it (min: the worst seed), "
                               "good = requests meeting it per s, cls = classic ITL (ms), t/s = tokens/s"),
                  box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    columns = ["mode", unit(sweep), "attain", "min", "good r/s", "cls p99", "cls max", "TTFT p95", "agg t/s",
               "spec t/s"] + [label for _, label in live]
    for col in columns:
        table.add_column(col, justify="left" if col == "mode" else "right", no_wrap=True, min_width=len(col))
    fmt = lambda v, spec="{:.1f}": "-" if v is None else spec.format(v)
    threshold = sweep["attainment"] - points.EPS
    for mode, rows in sweep["summary"].items():
        for row in rows:
            ok = row["slo_attainment"] is not None and row["slo_attainment"] >= threshold
            attain = f"[{'green' if ok else 'red'}]{fmt(row['slo_attainment'], '{:.3f}')}[/]"
            cells = [mode, f"{row['load']:g}", attain, fmt(row["slo_attainment_min"], "{:.3f}"),
                     fmt(row["goodput_rps"], "{:.2f}"), fmt(row["classic_itl_p99_ms"]),
                     fmt(row["classic_itl_max_ms"]), fmt(row["ttft_p95_ms"]), fmt(row["aggregate_tok_s"]),
                     fmt(row["spec_tok_s"])]
            deltas = row.get("metrics_delta") or {}
            cells += [fmt(deltas.get(name), "{:g}") for name, _ in live]
            table.add_row(*cells)
        table.add_section()
    console.print(table)
    console.print(capacity_line(sweep), highlight=False, soft_wrap=True)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def main(args: argparse.Namespace) -> int:
    console = Console()
    if not console.is_terminal:  # a log or a pipe: the table's full width, not 80 columns
        console = Console(width=max(console.width, 132))
    try:
        sweep = Sweep(settings_from(args))
        with Progress(TextColumn("sweep {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal,
                      auto_refresh=sweep.settings.jobs <= 1) as bar:  # no refresh thread in a forking process
            task = bar.add_task("", total=len(sweep.tasks))

            def advance(p: dict) -> None:
                bar.update(task, advance=1, description=f"{p['mode']} @ {p['load']:g}")
                bar.refresh()
            done = sweep.run(advance)
    except ValueError as exc:  # SweepError, ScenarioError, SloError, GateError: one line, as written
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True, highlight=False)
        return 2
    print_table(console, done)
    if "verified" in done:
        verify.print_verified(console, done)
    text = dumps(done)
    if args.json:
        _write(args.json, text)
    if args.out:
        from harness.report import sweep_page

        index = sweep_page.write(done, args.out)
        console.print(f"sweep page: {index}", soft_wrap=True, highlight=False)
    try:
        _write(STORE, text)
    except OSError as exc:  # a read-only working directory: the sweep itself ran and was printed
        console.print(f"[yellow]not stored[/] as {STORE} ({exc.strerror or exc}); coopsched report will not show it",
                      soft_wrap=True, highlight=False)
    return 0
