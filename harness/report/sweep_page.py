"""The sweep's figures and page: latency, goodput and attainment vs load per mode, capacity per mode.

Figures follow harness/report/plots.py: matplotlib without pyplot state, each `*_figure`
returns (Figure, data) where data is what was plotted, artists carry a `gid`. `write`
makes `coopsched sweep --out DIR`; `section` is the latest sweep's part of `coopsched report`.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from matplotlib.figure import Figure

from harness.report.plots import _log_if_wide, _mode_order, mode_color

LATENCY_PANELS = (("classic_itl_p99_ms", "classic ITL p99", "itl_ms"),
                  ("classic_itl_max_ms", "classic ITL max (the stall)", "itl_ms"),
                  ("ttft_p95_ms", "TTFT p95", "ttft_ms"))
FIGURES = (("latency", "sweep_latency.png", "latency vs load"), ("goodput", "sweep_goodput.png", "goodput vs load"),
           ("capacity", "sweep_capacity.png", "capacity per mode"))


def _unit(sweep: dict) -> str:
    if sweep.get("load_unit") == "speedup":  # a replayed trace: its own pace times the load
        return "speed-up of the trace (open loop)"
    return "requests/s (open loop)" if sweep["load_kind"] == "rate" else "users (closed loop)"


def _series(sweep: dict, key: str) -> dict[str, dict]:
    """Per mode: loads, the mean over seeds, and every seed's (load, value)."""
    out = {}
    for mode in _mode_order(sweep["summary"]):
        rows = sweep["summary"][mode]
        seeds = [(p["load"], p[key]) for p in sweep["points"] if p["mode"] == mode and p[key] is not None]
        out[mode] = {"loads": [r["load"] for r in rows], "mean": [r[key] for r in rows], "seeds": seeds}
    return out


def _style(ax, sweep: dict, title: str, ylabel: str) -> None:
    ax.set_title(title, loc="left", fontsize=10, fontweight="bold")
    ax.set_xlabel(_unit(sweep))
    ax.set_ylabel(ylabel)
    ax.set_xticks(sweep["loads"], [f"{load:g}" for load in sweep["loads"]])
    ax.grid(color="#e5e5e5", lw=0.6)


def _lines(ax, data: dict[str, dict], key: str) -> None:
    for i, (mode, d) in enumerate(data.items()):
        color = mode_color(mode, i)
        ax.plot(d["loads"], [float("nan") if v is None else v for v in d["mean"]], marker="o", ms=5, lw=1.8,
                color=color, label=mode, gid=f"{key}:{mode}")
        if d["seeds"]:
            xs, ys = zip(*d["seeds"])
            ax.plot(xs, ys, linestyle="none", marker=".", ms=4, color=color, alpha=0.35, gid=f"{key}:{mode}:seeds")


def latency_figure(sweep: dict) -> tuple[Figure, dict]:
    """Classic ITL p99 and max, TTFT p95 vs load; the SLO's limit dashed (dots: each seed)."""
    fig = Figure(figsize=(16, 4.2), layout="constrained")
    axes = fig.subplots(1, len(LATENCY_PANELS), squeeze=False)[0]
    data = {}
    for ax, (key, title, limit_key) in zip(axes, LATENCY_PANELS):
        data[key] = series = _series(sweep, key)
        _lines(ax, series, key)
        limit = sweep["slo"].get(limit_key)
        if limit is not None:
            ax.axhline(limit, color="#8B0000", ls="--", lw=1.1, label=f"SLO {limit_key} = {limit:g}", gid=f"slo:{key}")
        _log_if_wide(ax, [v for d in series.values() for _, v in d["seeds"]] + ([limit] if limit else []))
        _style(ax, sweep, title, "ms")
        ax.legend(fontsize=8, title="mode (dots: each seed)", title_fontsize=7.5)
    fig.suptitle(f"{sweep['scenario']}: latency vs load per mode ({sweep['clock']} time)", x=0.01, ha="left",
                 fontsize=11)
    return fig, {"series": data, "slo": sweep["slo"]}


def goodput_figure(sweep: dict) -> tuple[Figure, dict]:
    """Goodput (requests meeting the SLO per s) and attainment vs load; the --attainment line dashed."""
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2, squeeze=False)[0]
    goodput, attainment = _series(sweep, "goodput_rps"), _series(sweep, "slo_attainment")
    _lines(left, goodput, "goodput_rps")
    if sweep["load_kind"] == "rate" and sweep.get("load_unit") != "speedup":  # a speed-up is not a rate
        left.plot(sweep["loads"], sweep["loads"], color="#999999", ls=":", lw=1, label="offered", gid="offered")
    _style(left, sweep, "goodput", "requests meeting the SLO per s")
    left.legend(fontsize=8)
    _lines(right, attainment, "slo_attainment")
    right.axhline(sweep["attainment"], color="#8B0000", ls="--", lw=1.1, label=f"--attainment {sweep['attainment']:g}",
                  gid="threshold")
    _style(right, sweep, "SLO attainment", "share of requests meeting the SLO")
    right.set_ylim(-0.02, 1.02)
    right.legend(fontsize=8)
    slo = " and ".join(f"{k} {v:g}" for k, v in sweep["slo"].items() if v is not None)
    fig.suptitle(f"{sweep['scenario']}: goodput and attainment vs load (SLO {slo})", x=0.01, ha="left", fontsize=11)
    return fig, {"goodput_rps": goodput, "slo_attainment": attainment, "attainment": sweep["attainment"]}


def capacity_figure(sweep: dict) -> tuple[Figure, dict]:
    """One bar per mode: its capacity (none: no bar, labelled)."""
    modes = _mode_order(sweep["capacity"])
    values = [sweep["capacity"][m] for m in modes]
    fig = Figure(figsize=(6.5, 3.8), layout="constrained")
    ax = fig.subplots()
    for i, (mode, value) in enumerate(zip(modes, values)):
        ax.bar(i, value or 0, color=mode_color(mode, i), width=0.6, gid=f"capacity:{mode}")
        ax.text(i, value or 0, "none" if value is None else f"{value:g}", ha="center", va="bottom", fontsize=10,
                fontweight="bold")
    ax.set_xticks(range(len(modes)), modes)
    ax.set_ylabel(_unit(sweep))
    ax.set_ylim(0, max(sweep["loads"]) * 1.12)
    ax.grid(axis="y", color="#e5e5e5", lw=0.6)
    ax.set_title(f"capacity: highest load with mean attainment >= {sweep['attainment']:g} there and below",
                 loc="left", fontsize=9.5)
    return fig, dict(zip(modes, values))


def render_figures(sweep: dict, out: Path, prefix: str = "") -> dict[str, tuple[str, object]]:
    """The three PNGs into `out`: {key: (file name, plotted data)}."""
    made = {}
    for (key, name, _), build in zip(FIGURES, (latency_figure, goodput_figure, capacity_figure)):
        fig, data = build(sweep)
        fig.savefig(out / f"{prefix}{name}", dpi=110, facecolor="white")
        made[key] = (f"{prefix}{name}", data)
    return made


def _fmt(v, spec: str = "{:.1f}") -> str:
    return "-" if v is None else spec.format(v)


def tables(sweep: dict) -> str:
    """The capacity per mode, then every mode x load (means over seeds)."""
    unit = "x" if sweep.get("load_unit") == "speedup" else "req/s" if sweep["load_kind"] == "rate" else "users"
    cap = "".join(f"<tr><td class='l'>{html.escape(m)}</td><td>{'none' if v is None else f'{v:g} {unit}'}</td></tr>"
                  for m, v in sweep["capacity"].items())
    head = ("<tr><th class='l'>mode</th><th>load</th><th>attainment</th><th>worst seed</th><th>goodput r/s</th>"
            "<th>classic ITL p99</th><th>classic ITL max</th><th>TTFT p95</th><th>aggregate tok/s</th>"
            "<th>spec tok/s</th></tr>")
    rows = []
    for mode, summary in sweep["summary"].items():
        for r in summary:
            ok = r["slo_attainment"] is not None and r["slo_attainment"] >= sweep["attainment"] - 1e-9
            rows.append(f"<tr><td class='l'>{html.escape(mode)}</td><td>{r['load']:g}</td>"
                        f"<td class='{'ok' if ok else 'bad'}'>{_fmt(r['slo_attainment'], '{:.3f}')}</td>"
                        f"<td>{_fmt(r['slo_attainment_min'], '{:.3f}')}</td><td>{_fmt(r['goodput_rps'], '{:.2f}')}</td>"
                        + "".join(f"<td>{_fmt(r[k])}</td>" for k in ("classic_itl_p99_ms", "classic_itl_max_ms",
                                                                      "ttft_p95_ms", "aggregate_tok_s", "spec_tok_s"))
                        + "</tr>")
    return (f"<table id='sweep-capacity'><tr><th class='l'>mode</th><th>capacity</th></tr>{cap}</table>"
            f"<table id='sweep-points'>{head}{''.join(rows)}</table>")


def describe(sweep: dict) -> str:
    slo = ", ".join(f"{k} = {v:g}" for k, v in sweep["slo"].items() if v is not None)
    where = f"against {sweep['target']}" if sweep.get("target") else "on the mock"
    return (f"{sweep['scenario']}, {sweep['load_kind']} sweep {where} ({sweep['clock']} time): loads "
            f"{', '.join(f'{x:g}' for x in sweep['loads'])} x modes {', '.join(sweep['modes'])} x {sweep['seeds']} "
            f"seed(s); SLO {slo} per token, attainment >= {sweep['attainment']:g}")


def section(sweep: dict, images: dict[str, str]) -> str:
    """The HTML of a sweep (tables and the figures already written as `images`)."""
    imgs = "".join(f"<img src='{html.escape(images[key])}' alt='{alt}'>" for key, _, alt in FIGURES if key in images)
    return f"<p>{html.escape(describe(sweep))}</p>{tables(sweep)}{imgs}"


PAGE_CSS = """body{font-family:-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;margin:24px auto;
max-width:1560px;color:#222;padding:0 20px}table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f3f3f3}td.l,th.l{text-align:left}
.ok{color:#1e7b45}.bad{color:#c0392b;font-weight:bold}img{max-width:100%;border:1px solid #eee;margin:6px 0}"""


def write(sweep: dict, out: Path) -> Path:
    """`--out DIR`: sweep.json, the three PNGs and index.html (opens from disk)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(sweep, indent=1) + "\n")
    made = render_figures(sweep, out)
    body = section(sweep, {key: name for key, (name, _) in made.items()})
    (out / "index.html").write_text(
        f"<!doctype html>\n<html lang='en'><head><meta charset='utf-8'><title>coopsched sweep "
        f"{html.escape(sweep['scenario'])}</title><style>{PAGE_CSS}</style></head><body>"
        f"<h1>coopsched sweep: {html.escape(sweep['scenario'])}</h1>{body}"
        "<p>Data: <a href='sweep.json'>sweep.json</a> (every point; <code>coopsched sweep --json</code>).</p>"
        "</body></html>\n")
    return out / "index.html"


def load(path: Path) -> dict | None:
    """A stored sweep, or None when there is none (or it is not a sweep)."""
    try:
        sweep = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return sweep if isinstance(sweep, dict) and {"points", "summary", "capacity"} <= set(sweep) else None
