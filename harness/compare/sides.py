"""What `coopsched compare` reads: a trace JSON (`run --json`), a sweep JSON or a locust report,
reduced to one table per file: key -> metric -> value, with the samples behind each percentile.

Runs (traces, locust reports) are keyed scenario/mode and reduced with the sweep's own figures
(harness/sweep/points.py) under one SLO; sweeps are keyed mode/load (means over seeds) and
add each mode's capacity. Anything that cannot be read or compared is a CompareError.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.compare.rule import Metric
from harness.run.slo import Slo
from harness.sweep.points import Timed, figures

METRICS = (
    Metric("classic_itl_p50_ms", "ms", False, "classic ITL p50", percentile=True),
    Metric("classic_itl_p99_ms", "ms", False, "classic ITL p99", percentile=True),
    Metric("classic_itl_max_ms", "ms", False, "classic ITL max"),
    Metric("ttft_p50_ms", "ms", False, "TTFT p50", percentile=True),
    Metric("ttft_p95_ms", "ms", False, "TTFT p95", percentile=True),
    Metric("aggregate_tok_s", "tok/s", True, "aggregate tokens/s"),
    Metric("spec_tok_s", "tok/s", True, "speculative tokens/s"),
    Metric("slo_attainment", "share", True, "SLO attainment"),
)
CAPACITY = Metric("capacity", "load", True, "capacity (highest load meeting the SLO)")
SAMPLES_OF = {"classic_itl_p50_ms": "classic_gaps", "classic_itl_p99_ms": "classic_gaps",
              "ttft_p50_ms": "ttft", "ttft_p95_ms": "ttft"}


class CompareError(ValueError):
    """Two files that cannot be compared; the message says why."""


@dataclass
class Side:
    path: Path
    kind: str                                      # "runs" | "sweep"
    table: dict[str, dict] = field(default_factory=dict)
    samples: dict[str, dict] = field(default_factory=dict)
    timed: dict[str, list[Timed]] = field(default_factory=dict)  # runs: per key, for the page's plots
    capacity: dict[str, dict] = field(default_factory=dict)     # sweeps: mode -> {"capacity": load}
    sweep: dict | None = None
    note: str = ""


def load(path: Path, slo: Slo) -> Side:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise CompareError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CompareError(f"{path}: not a JSON file ({exc})") from None
    if isinstance(data, list) and data and all(isinstance(t, dict) and "requests" in t for t in data):
        return _runs(path, [(f"{t.get('scenario')}/{t.get('mode')}", _trace_timed(t)) for t in data], slo)
    if isinstance(data, dict) and isinstance(data.get("points"), list) and "capacity" in data:
        return _sweep(path, data)
    if isinstance(data, dict) and isinstance(data.get("per_request"), list) and "bound_ms" in data:
        key = f"{data.get('scenario', 'concurrency2')}/{data.get('mode') or 'external'}"
        return _runs(path, [(key, _locust_timed(data))], slo, "locust report")
    raise CompareError(f"{path}: not a trace JSON (coopsched run --json), a sweep JSON (coopsched sweep --json) or "
                       "a locust report (locust -f scenarios/concurrency2.py --report-json)")


def _trace_timed(trace: dict) -> list[Timed]:
    return [Timed(str(r["id"]), float(r["arrival_ms"]), r["token_times_ms"], bool(r["speculative"]),
                  (r.get("error") or "error") if r.get("finish_reason") == "error" or r.get("error") else None)
            for r in trace["requests"]]


def _locust_timed(report: dict) -> list[Timed]:
    """The report's per-request timings; requests the run's end cut off (no finish) are left out."""
    return [Timed(str(r["id"]), float(r["arrival_ms"]), r["token_times_ms"], r.get("kind") == "spec", r.get("error"))
            for r in report["per_request"] if r.get("finish_reason") or r.get("error")]


def _runs(path: Path, runs: list[tuple[str, list[Timed]]], slo: Slo, what: str = "trace") -> Side:
    side = Side(path, "runs", note=what)
    for key, timed in runs:
        if key in side.table:
            raise CompareError(f"{path}: {key} appears twice; compare files with one run per scenario x mode")
        if not timed:
            raise CompareError(f"{path}: {key} has no finished request")
        figs = figures(timed, slo)
        side.table[key] = {m.name: figs[m.name] for m in METRICS}
        side.samples[key] = figs["samples"]
        side.timed[key] = timed
    return side


def _sweep(path: Path, sweep: dict) -> Side:
    """mode/load rows from the summary (means over seeds), samples summed over seeds, mode rows of capacity."""
    side = Side(path, "sweep", sweep=sweep, note="sweep")
    for mode, rows in sweep.get("summary", {}).items():
        for row in rows:
            key = f"{mode}/{row['load']:g}"
            side.table[key] = {m.name: row.get(m.name) for m in METRICS}
            group = [p for p in sweep["points"] if p["mode"] == mode and p["load"] == row["load"]]
            if group and all("samples" in p for p in group):
                side.samples[key] = {kind: sum(p["samples"][kind] for p in group) for kind in ("classic_gaps", "ttft")}
    for mode, load in sweep["capacity"].items():  # no load met the SLO: capacity 0, below every swept load
        side.capacity[mode] = {CAPACITY.name: 0 if load is None else load}
    return side


def without_mode(side: Side) -> Side:
    """The side keyed by scenario (runs) or load (sweeps) alone, to compare two modes (or two servers
    that report different modes) with each other; each key must then hold one mode."""
    def rekey(table: dict, keep) -> dict:
        out: dict = {}
        for key, value in table.items():
            short = keep(key)
            if short in out:
                raise CompareError(f"{side.path}: --ignore-mode needs one mode per file, and it holds several for "
                                   f"{short or 'its capacity'} ({', '.join(k for k in table if keep(k) == short)})")
            out[short] = value
        return out
    if side.kind == "sweep":
        return Side(side.path, side.kind, rekey(side.table, lambda k: k.split("/", 1)[1]),
                    rekey(side.samples, lambda k: k.split("/", 1)[1]), sweep=side.sweep, note=side.note,
                    capacity=rekey(side.capacity, lambda k: "capacity"))
    scenario = lambda k: k.rsplit("/", 1)[0]
    return Side(side.path, side.kind, rekey(side.table, scenario), rekey(side.samples, scenario),
                rekey(side.timed, scenario), note=side.note)


def comparable(base: Side, new: Side) -> None:
    """Refuse (CompareError, saying why) two sides whose rows do not mean the same thing."""
    if base.kind != new.kind:
        raise CompareError(f"{base.path} is a {base.note} and {new.path} a {new.note}: compare two runs (trace JSON "
                           "or locust reports) or two sweeps")
    if base.kind == "sweep":
        for key in ("load_kind", "slo", "attainment", "load_unit"):
            b, n = base.sweep.get(key), new.sweep.get(key)
            if b != n:
                raise CompareError(f"the sweeps differ in {key} ({json.dumps(b)} vs {json.dumps(n)}): their loads, "
                                   "attainments and capacities do not mean the same thing; sweep both alike")
    common = set(base.table) & set(new.table)
    if not common:
        keys = "mode/load" if base.kind == "sweep" else "scenario/mode"
        raise CompareError(f"{base.path} and {new.path} have no {keys} in common (base: "
                           f"{', '.join(sorted(base.table)[:6])}; new: {', '.join(sorted(new.table)[:6])})")


def samples_table(side: Side) -> dict[str, dict[str, int]]:
    """key -> percentile metric -> how many samples it was computed over."""
    return {key: {metric: counts[kind] for metric, kind in SAMPLES_OF.items()} for key, counts in side.samples.items()}
