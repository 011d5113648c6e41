"""`coopsched compare BASE NEW`: which metric moved between two runs or two sweeps, by how much,
and whether that is a regression. Exit 0: none; 1: a regression; 2: the files cannot be
compared (one line saying why).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.compare import rule, sides
from harness.compare.sides import CAPACITY, METRICS, CompareError, Side
from harness.run import slo as slo_module
from harness.run.slo import SloError

DEFAULT_THRESHOLD_PCT = 5.0
DEFAULT_MIN_SAMPLES = 30
SHOWN = 8  # regressions named on the last line
_NUMBER = re.compile(r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)%?")
EPILOG = f"""BASE and NEW: two trace JSON files (coopsched run --json, also --target) or locust reports, keyed
scenario/mode; or two sweep JSON files (coopsched sweep --json), keyed mode/load, plus each mode's capacity
(none counts as 0). A row regresses when NEW is worse than BASE by more than --threshold percent of BASE in the
metric's bad direction (ITL and TTFT up, tokens/s, attainment and capacity down), or when BASE had it and NEW
has not. A percentile (p50, p95, p99) over fewer than --min-samples samples (classic gaps for ITL, requests for
TTFT; the fewer of the two sides) is shown as advisory and never fails. Defaults: --threshold
{DEFAULT_THRESHOLD_PCT:g}, --min-samples {DEFAULT_MIN_SAMPLES}, --slo {slo_module.DEFAULT_SLO} (runs; a sweep
carries its own). Exit 0: no regression; 1: a regression; 2: the files cannot be compared."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("base", type=Path, metavar="BASE", help="the reference run or sweep (JSON)")
    parser.add_argument("new", type=Path, metavar="NEW", help="the run or sweep to judge against it (JSON)")
    parser.add_argument("--threshold", default=str(DEFAULT_THRESHOLD_PCT), metavar="PCT",
                        help="how much worse than BASE, in percent of it, regresses "
                             f"(default {DEFAULT_THRESHOLD_PCT:g})")
    parser.add_argument("--min-samples", default=str(DEFAULT_MIN_SAMPLES), metavar="N",
                        help=f"a percentile over fewer samples is advisory (default {DEFAULT_MIN_SAMPLES})")
    parser.add_argument("--slo", default=slo_module.DEFAULT_SLO, metavar="itl_ms=X,ttft_ms=Y",
                        help=f"the per-token SLO of slo_attainment for runs (default {slo_module.DEFAULT_SLO})")
    parser.add_argument("--ignore-mode", action="store_true",
                        help="key rows by scenario (runs) or load (sweeps) alone: compare one mode with another, "
                             "e.g. a burst run with a slice run (each file must hold one mode)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the rows and regressions as JSON here")
    parser.add_argument("--out", type=Path, metavar="DIR", help="write index.html, compare.json and PNG plots here")


def parse_threshold(text: str) -> float:
    if not _NUMBER.fullmatch(text.strip()):
        raise CompareError(f"--threshold {text!r}: want a percentage >= 0, e.g. 5 (or 5%)")
    return float(text.strip().rstrip("%")) / 100.0


def parse_min_samples(text: str) -> int:
    if not text.strip().isdigit():
        raise CompareError(f"--min-samples {text!r}: want a whole number >= 0")
    return int(text)


def compare(base: Side, new: Side, threshold: float, min_samples: int) -> list[rule.Row]:
    """The rows of two comparable sides (a sweep's capacity first: its headline); a percentile's
    samples are the fewer of the two sides'."""
    b, n = sides.samples_table(base), sides.samples_table(new)
    fewer = {key: {m: min(b[key][m], n[key][m]) for m in b[key]} for key in set(b) & set(n)}
    rows = rule.compare_tables(base.table, new.table, METRICS, threshold, fewer, min_samples)
    if base.kind == "sweep":
        rows = rule.compare_tables(base.capacity, new.capacity, (CAPACITY,), threshold) + rows
    return rows


def payload(args: argparse.Namespace, base: Side, threshold: float, min_samples: int, rows: list[rule.Row]) -> dict:
    slo = base.sweep["slo"] if base.sweep else slo_module.parse_slo(args.slo).to_json()
    return {"base": str(args.base), "new": str(args.new), "kind": base.kind, "threshold_pct": threshold * 100,
            "min_samples": min_samples, "slo": slo,
            "rows": [r.to_json() for r in rows], "regressions": [r.to_json() for r in rule.regressions(rows)]}


STYLE = {"worse": "red", "missing": "red", "better": "green", "advisory": "yellow", "new": "blue", "same": ""}


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def print_table(console: Console, rows: list[rule.Row], base: Path, new: Path, threshold: float) -> None:
    table = Table(title=escape(f"coopsched compare {base} -> {new} (regressed: worse by > {threshold * 100:g}%)"),
                  box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    for col in ("key", "metric", "base", "new", "delta %", "samples", "verdict"):
        table.add_column(col, justify="left" if col in ("key", "metric", "verdict") else "right", no_wrap=True)
    last = None
    for r in rows:
        if last is not None and r.key != last:
            table.add_section()
        last = r.key
        delta = "-" if r.delta_pct is None else f"{r.delta_pct:+.1f}"
        style = STYLE[r.verdict]
        verdict = f"[{style}]{r.verdict}[/]" if style else r.verdict
        table.add_row(escape(r.key), r.metric, _fmt(r.base), _fmt(r.new), delta,
                      "-" if r.samples is None else str(r.samples), verdict)
    console.print(table)


def verdict_line(rows: list[rule.Row], threshold: float, min_samples: int) -> str:
    bad = rule.regressions(rows)
    advisory = sum(r.verdict == "advisory" for r in rows)
    note = (f"; {advisory} advisory (worse, but a percentile over fewer than {min_samples} samples)"
            if advisory else "")
    if not bad:
        return f"compare: no regression beyond {threshold * 100:g}% in {len(rows)} rows{note}"
    named = "; ".join(f"{r.key} {r.metric} {_fmt(r.base)} -> {_fmt(r.new)}"
                      + (f" ({r.delta_pct:+.1f}%)" if r.delta_pct is not None else f" ({r.verdict})")
                      for r in bad[:SHOWN])
    more = f"; and {len(bad) - SHOWN} more (the table and --json list them all)" if len(bad) > SHOWN else ""
    return f"compare: {len(bad)} regression(s) beyond {threshold * 100:g}%: {named}{more}{note}"


def main(args: argparse.Namespace) -> int:
    console = Console()
    if not console.is_terminal:  # a CI log: the table's full width, not 80 columns
        console = Console(width=max(console.width, 132))
    try:
        threshold, min_samples = parse_threshold(args.threshold), parse_min_samples(args.min_samples)
        slo = slo_module.parse_slo(args.slo)
        base, new = sides.load(args.base, slo), sides.load(args.new, slo)
        if getattr(args, "ignore_mode", False):
            base, new = sides.without_mode(base), sides.without_mode(new)
        sides.comparable(base, new)
    except (CompareError, SloError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True, highlight=False)
        return 2
    rows = compare(base, new, threshold, min_samples)
    print_table(console, rows, args.base, args.new, threshold)
    body = payload(args, base, threshold, min_samples, rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(body, indent=1) + "\n")
    if args.out:
        from harness.compare import page

        index = page.write(body, base, new, args.out)
        console.print(f"compare page: {index}", soft_wrap=True, highlight=False)
    bad = rule.regressions(rows)
    console.print(("[red]" if bad else "[green]") + escape(verdict_line(rows, threshold, min_samples)) + "[/]",
                  soft_wrap=True, highlight=False)
    return 1 if bad else 0
