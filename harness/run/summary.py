"""The modes side by side: one row per scenario x mode from the trace JSON.

Columns (docs/architecture.md vocabulary): classic stall (largest classic ITL),
the same over only the gaps that contain speculative work (the HOL stall; the
rest is classic admissions), classic ITL p99 (pooled over every classic
request's gaps), speculative request tokens/s, aggregate tokens/s, and the
ratio of aggregate tokens/s to the legacy burst in the same run
(`ratio_to_burst`, set by the checks; on a real clock, taken against the burst
run printed beside it: `ratios_against_printed_burst`).
"""

from __future__ import annotations

import numpy as np

COLUMNS = ("scenario", "mode", "stall", "w/spec", "ITL p99", "spec tok/s", "agg tok/s", "x burst")
SPEC_DETAILS = ("slice0", "window", "burst")


def _spec_ends(trace: dict) -> list[float]:
    spec = {r["id"] for r in trace["requests"] if r["speculative"]}  # a chunk tick may be a slice 0's
    return [t["end_ms"] for t in trace["ticks"]  # empty in a --target trace
            if t["action"] in ("spec_round", "fused") or t.get("detail") in SPEC_DETAILS
            or (t.get("detail") == "chunk" and t["request_ids"][0] in spec)]


def summary_row(trace: dict) -> dict:
    times = [r["token_times_ms"] for r in trace["requests"] if not r["speculative"]]
    starts = np.array([a for t in times for a in t[:-1]], dtype=float)
    stops = np.array([b for t in times for b in t[1:]], dtype=float)
    gaps = stops - starts
    ends = np.array(sorted(_spec_ends(trace)), dtype=float)
    with_spec = gaps[np.searchsorted(ends, stops, "right") > np.searchsorted(ends, starts, "right")]
    throughput = trace.get("throughput", {})
    return {
        "scenario": trace["scenario"], "mode": trace["mode"],
        "classic_stall_ms": float(gaps.max()) if gaps.size else None,
        "classic_stall_spec_ms": float(with_spec.max()) if with_spec.size else None,
        "classic_itl_p99_ms": float(np.percentile(gaps, 99)) if gaps.size else None,
        "spec_tok_s": throughput.get("spec_tok_s"),
        "aggregate_tok_s": throughput.get("aggregate_tok_s"),
        "ratio_to_burst": trace.get("ratio_to_burst"),
    }


def ratios_against_printed_burst(traces: list[dict]) -> None:
    """Real clock: every ratio_to_burst against the burst trace of the same scenario and seed
    printed beside it. The checks took it against a reference burst run of their own, which
    in virtual time is the same run, but on a real clock is another run with other timings."""
    bursts = {(t["scenario"], t["seed"]): t for t in traces if t["mode"] == "burst" and t["clock"] == "real"}
    for trace in traces:
        burst = bursts.get((trace["scenario"], trace["seed"]))
        if trace["clock"] != "real" or burst is None or "ratio_to_burst" not in trace:
            continue
        mine = trace.get("throughput", {}).get("aggregate_tok_s")
        legacy = burst.get("throughput", {}).get("aggregate_tok_s")
        ratio = mine / legacy if mine and legacy else None
        trace["ratio_to_burst"] = None if ratio is None else round(ratio, 6)
        for c in trace["checks"]:
            if c["name"] == "throughput_vs_burst" and c.get("skipped") and ratio is not None:
                c["note"] = (f"real clock: ratio {ratio:.3f} (against the burst run printed beside it) "
                             "reported in the table, not gated")


def print_summary(console, traces: list[dict]) -> None:
    from rich.table import Table

    table = Table(title="modes side by side: classic stall, the same over gaps with speculative work "
                        "(w/spec) and classic ITL p99 in ms; tokens/s; aggregate tokens/s x the legacy burst",
                  box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("scenario", "mode") else "right", no_wrap=True,
                         min_width=len(col))
    fmt = lambda v, spec="{:.1f}": "-" if v is None else spec.format(v)
    for row in map(summary_row, traces):
        table.add_row(row["scenario"], row["mode"], fmt(row["classic_stall_ms"]),
                      fmt(row["classic_stall_spec_ms"]), fmt(row["classic_itl_p99_ms"]), fmt(row["spec_tok_s"]),
                      fmt(row["aggregate_tok_s"]), fmt(row["ratio_to_burst"], "{:.3f}"))
    console.print(table)
