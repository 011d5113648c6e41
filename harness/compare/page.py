"""The compare page: index.html (opens from disk), compare.json and PNGs beside it.

Runs: per scenario/mode, the classic ITL CDF and the tokens-streamed timeline of BASE
(solid) and NEW (dashed) on one axis. Sweeps: latency, attainment and throughput vs load
per mode, BASE solid and NEW dashed, and the capacity per mode as paired bars.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from harness.compare.sides import Side
from harness.report.plots import mode_color
from harness.run import metrics

MAX_PANELS = 16   # the first keys only: a page is for reading, the JSON has every row
PLOT_POINTS = 4000  # points per curve at most
SWEEP_PANELS = (("classic_itl_p99_ms", "classic ITL p99 (ms)"), ("ttft_p95_ms", "TTFT p95 (ms)"),
                ("slo_attainment", "SLO attainment"), ("aggregate_tok_s", "aggregate tokens/s"))
CSS = """body{font-family:-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1400px;
padding:0 20px;color:#222}table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:3px 8px;
text-align:right}td.l,th.l{text-align:left}th{background:#f3f3f3}tr.worse td,tr.missing td{background:#fbdcdc}
tr.better td{background:#ddf3e4}tr.advisory td{background:#fff6d6}img{max-width:100%;border:1px solid #eee}
.meta{color:#666;font-size:13px}"""


def _grid(n: int) -> tuple[Figure, list]:
    cols = min(4, max(1, n))
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(4.2 * cols, 3.2 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _mode(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def cdf_figure(base: Side, new: Side, keys: list[str]) -> Figure:
    fig, axes = _grid(len(keys))
    for ax, key in zip(axes, keys):
        for side, style, label in ((base, "-", "base"), (new, "--", "new")):
            gaps = np.sort([g for t in side.timed.get(key, ()) if not t.speculative
                            for g in metrics.itl(t.token_times_ms)])
            if gaps.size:
                every = max(1, gaps.size // PLOT_POINTS)
                index = np.unique(np.append(np.arange(0, gaps.size, every), gaps.size - 1))  # the max stays
                ax.step(gaps[index], (index + 1) / gaps.size, where="post", ls=style,
                        color=mode_color(_mode(key)), label=label)
        positive = [line.get_xdata()[-1] for line in ax.get_lines()] + [g for line in ax.get_lines()
                                                                      for g in line.get_xdata()[:1] if g > 0]
        if positive and max(positive) / min(positive) > 20:  # a burst's stall flattens the rest: log gaps
            ax.set_xscale("log")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("classic inter-token gap (ms)", fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7, loc="lower right")
    return fig


def timeline_figure(base: Side, new: Side, keys: list[str]) -> Figure:
    fig, axes = _grid(len(keys))
    for ax, key in zip(axes, keys):
        for side, style, label in ((base, "-", "base"), (new, "--", "new")):
            times = np.sort([t for r in side.timed.get(key, ()) for t in r.token_times_ms])
            if times.size:
                every = max(1, times.size // PLOT_POINTS)  # a day of tokens: every n-th is the same curve
                ax.plot(times[::every] / 1e3, np.arange(1, times.size + 1)[::every], ls=style,
                        color=mode_color(_mode(key)), label=label)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("time (s)", fontsize=8)
        ax.set_ylabel("tokens streamed", fontsize=8)
        ax.legend(fontsize=7, loc="upper left")
    return fig


def sweep_figure(base: Side, new: Side) -> Figure:
    fig, axes = _grid(len(SWEEP_PANELS))
    for ax, (metric, title) in zip(axes, SWEEP_PANELS):
        for side, style, label in ((base, "-", "base"), (new, "--", "new")):
            for i, (mode, rows) in enumerate(side.sweep["summary"].items()):
                points = [(r["load"], r[metric]) for r in rows if r.get(metric) is not None]
                if points:
                    ax.plot(*zip(*points), ls=style, marker="o", ms=3, color=mode_color(mode, i),
                            label=f"{mode} {label}")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(f"load ({side.sweep['load_kind']})", fontsize=8)
        ax.legend(fontsize=6, ncol=2)
    return fig


def capacity_figure(base: Side, new: Side) -> Figure:
    fig = Figure(figsize=(6, 3.4), layout="constrained")
    ax = fig.subplots()
    modes = list(dict.fromkeys([*base.capacity, *new.capacity]))
    x = np.arange(len(modes))
    for offset, side, label, hatch in ((-0.2, base, "base", ""), (0.2, new, "new", "//")):
        values = [side.capacity.get(m, {}).get("capacity") or 0 for m in modes]
        ax.bar(x + offset, values, 0.4, label=label, hatch=hatch,
               color=[mode_color(m, i) for i, m in enumerate(modes)], edgecolor="#333")
    ax.set_xticks(x, modes)
    ax.set_ylabel("capacity (highest load meeting the SLO)", fontsize=8)
    ax.legend(fontsize=8)
    return fig


def _table(body: dict) -> str:
    head = "".join(f"<th{' class=l' if c in ('key', 'metric', 'verdict') else ''}>{c}</th>"
                   for c in ("key", "metric", "base", "new", "delta %", "samples", "verdict"))
    fmt = lambda v: "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
    rows = "".join(f"<tr class='{r['verdict']}'><td class='l'>{html.escape(r['key'])}</td>"
                   f"<td class='l'>{r['metric']}</td>"
                   f"<td>{fmt(r['base'])}</td><td>{fmt(r['new'])}</td><td>{fmt(r['delta_pct'])}</td>"
                   f"<td>{fmt(r['samples'])}</td><td class='l'>{r['verdict']}</td></tr>" for r in body["rows"])
    return f"<table id='rows'><tr>{head}</tr>{rows}</table>"


def write(body: dict, base: Side, new: Side, out: Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if base.kind == "sweep":
        figures = {"sweep.png": sweep_figure(base, new), "capacity.png": capacity_figure(base, new)}
    else:
        keys = sorted(set(base.timed) & set(new.timed))[:MAX_PANELS]
        figures = {"itl_cdf.png": cdf_figure(base, new, keys), "timeline.png": timeline_figure(base, new, keys)}
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=100, facecolor="white")
    (out / "compare.json").write_text(json.dumps(body, indent=1) + "\n")
    bad = len(body["regressions"])
    images = "".join(f"<h2>{html.escape(name[:-4])}</h2><img src='{name}' alt='{name}'>" for name in figures)
    (out / "index.html").write_text(
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>coopsched compare</title>"
        f"<style>{CSS}</style></head><body><h1>coopsched compare</h1>"
        f"<p class='meta'>base {html.escape(body['base'])} (solid) &middot; new {html.escape(body['new'])} (dashed) "
        f"&middot; threshold {body['threshold_pct']:g}% &middot; min samples {body['min_samples']}</p>"
        f"<p><b>{f'{bad} regression(s)' if bad else 'no regression'}</b></p>{images}<h2>rows</h2>{_table(body)}"
        "</body></html>\n")
    return out / "index.html"
