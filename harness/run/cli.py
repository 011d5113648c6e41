"""`coopsched run`: scenarios x modes, a table of checks, the trace JSON, exit 0 iff none failed.

The last line counts what held, failed and was skipped (with why); --strict fails a skipped check too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from coopsched.clock import ManualClock, RealClock
from coopsched.core import MODES
from coopsched.env import GateError
from harness.run import runner, scenario, trace_json
from harness.run.summary import print_summary, ratios_against_printed_burst
from harness.verdict.check import Tally, state


def positive_ms(text: str) -> float:
    """--hol-budget-ms: a number of ms > 0 (the env knob COOPSCHED_HOL_BUDGET_MS parses the same way)."""
    from coopsched.env import parse_hol_budget_ms

    warnings: list[str] = []
    try:
        value = parse_hol_budget_ms(text, warnings)
    except GateError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("COOPSCHED_HOL_BUDGET_MS", "--hol-budget-ms")) from None
    if warnings:
        raise argparse.ArgumentTypeError(f"{text!r} is not a decimal number of ms")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"scenarios to run: a shipped name or a path to a .toml file "
                             f"(default: all of {', '.join(scenario.available())})")
    parser.add_argument("--mode", choices=(*MODES, "all"),
                        help="scheduler mode; wins over MLXCEL_MTP_TICK_SLICE (default: the gates decide)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the trace JSON here")
    parser.add_argument("--seed", type=int, default=0, help="seed for prompts, acceptance and jitter (default 0)")
    parser.add_argument("--backend", choices=("mock", "mlx"), default="mock")
    parser.add_argument("--model", type=Path, metavar="DIR", help="MLX target model (default: tiny, built once)")
    parser.add_argument("--draft-model", type=Path, metavar="DIR", help="MLX draft model")
    parser.add_argument("--cost", type=Path, metavar="PROFILE.json", help="mock cost profile (coopsched calibrate)")
    parser.add_argument("--target", metavar="URL", help="run against an OpenAI-compatible server over HTTP")
    parser.add_argument("--hol-budget-ms", type=positive_ms, metavar="MS",
                        help="cost mode: the longest a classic row may wait on speculation "
                             "(wins over COOPSCHED_HOL_BUDGET_MS; default 50)")
    parser.add_argument("--prefill-chunk-tokens", type=int, metavar="N",
                        help="prefill at most N prompt tokens per tick, 0 = whole prompts (wins over the "
                             "scenario's [scheduler]; default: the scenario's, else 0)")
    parser.add_argument("--prefill-grant-interval", type=int, metavar="N",
                        help="slice, burst: decode ticks a chunked prompt yields before one chunk is granted, 0 "
                             "never (wins over MLXCEL_PREFILL_GRANT_INTERVAL and the scenario's; default 16)")
    parser.add_argument("--max-batch-prefill", type=int, metavar="M",
                        help="classic requests one prefill tick may admit together (wins over the scenario's; "
                             "default: the scenario's, else 1)")
    parser.add_argument("--strict", action="store_true",
                        help="a skipped check fails the run (exit 1): green then means every check ran and held")


def modes_for(args: argparse.Namespace, bare: bool) -> list[str | None]:
    if args.mode == "all" or (bare and args.mode is None):
        return list(MODES)
    return [args.mode]  # None: the gates decide


def backend_factory(args: argparse.Namespace):
    if args.backend == "mlx":
        from coopsched.backends.mlx_backend import scenario_backend_factory
        return scenario_backend_factory(args.model, args.draft_model)
    return runner.mock_backend  # a --cost profile prices the scenarios themselves (main)


def print_table(console: Console, traces: list[dict]) -> None:
    table = Table(title="coopsched run", show_lines=False)
    for col in ("scenario", "mode", "check", "value", "bound", "ok"):  # names wrap, never cut to "..."
        table.add_column(col, justify="right" if col in ("value", "bound") else "left", overflow="fold")
    for trace in traces:
        for c in trace["checks"]:
            fmt = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
            expect = "" if c["expect"] == "pass" else " (must fail)"
            verdict = {"skipped": "[yellow]skipped[/]", "held": "[green]ok[/]", "failed": "[red]FAIL[/]"}[state(c)]
            table.add_row(trace["scenario"], trace["mode"], c["name"] + expect, fmt(c["value"]),
                          fmt(c["bound"]), verdict)
    console.print(table)


def main(args: argparse.Namespace) -> int:
    console = Console()
    if not console.is_terminal:  # a log or a pipe: the table's full width, not 80 columns
        console = Console(width=max(console.width, 132))
    bare = not args.names and args.mode is None and args.json is None
    names = args.names or scenario.available()
    try:
        scenarios = [scenario.load(n) for n in names]
        if args.cost is not None and args.backend != "mlx":
            profile = runner.Profile.load(args.cost)
            scenarios = [runner.priced(s, profile) for s in scenarios]
            if profile.note:
                print(f"note: {profile.note}", file=sys.stderr)
        for warning in runner.gate_warnings(scenarios):  # as `coopsched serve` logs them; the run goes on
            print(f"warning: {warning}", file=sys.stderr)
        for note in (n for s in scenarios if s.workload for n in s.workload.notes):  # rows a replay left out
            print(f"note: {note}", file=sys.stderr)
        if args.target:
            from harness.live.http_target import run_against_target
            traces = [run_against_target(s, args.target, args.seed, console) for s in scenarios]
        else:
            factory = backend_factory(args)
            clock = RealClock if args.backend == "mlx" else ManualClock
            knobs = ("hol_budget_ms", "prefill_chunk_tokens", "max_batch_prefill", "prefill_grant_interval")
            options = {k: getattr(args, k) for k in knobs if getattr(args, k, None) is not None}
            traces = [runner.run_scenario(s, m, args.seed, backend_factory=factory, clock_factory=clock,
                                          options=options)
                      for s in scenarios for m in modes_for(args, bare)]
    except (GateError, ValueError, FileNotFoundError) as exc:  # one line, as written: no markup, no wrapping
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        return 2
    ratios_against_printed_burst(traces)
    print_table(console, traces)
    print_summary(console, traces)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        with args.json.open("w") as fp:
            trace_json.write(traces, fp)
    return verdict(console, traces, strict=getattr(args, "strict", False))


def verdict(console: Console, traces: list[dict], *, strict: bool = False) -> int:
    """The last line: 'all N expectations hold' only when every check ran and held; exit 1 on a
    failure (or, strict, a skip)."""
    tally = Tally.of((f"{t['scenario']}/{t['mode']}/{c['name']}", c) for t in traces for c in t["checks"])
    if tally.failed:
        console.print(f"[red]{len(tally.failed)} expectation(s) failed:[/] {', '.join(tally.failed)}")
    if tally.skipped and strict:
        console.print(f"[red]--strict: {len(tally.skipped)} skipped check(s) fail the run:[/] "
                      f"{', '.join(tally.skipped)}")
    colour = "green" if tally.ok(strict) and not tally.skipped else ("yellow" if tally.ok(strict) else "red")
    console.print(f"[{colour}]{escape(tally.line(len(traces)))}[/]", soft_wrap=True)
    return 0 if tally.ok(strict) else 1


if __name__ == "__main__":
    sys.exit(main(argparse.Namespace()))
