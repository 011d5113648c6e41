"""The report's figures (matplotlib, no pyplot state): tick timeline, classic ITL CDF, trends.

Each `*_figure` returns (Figure, data): `data` is exactly what was handed to
matplotlib, so tests assert on the plotted data, never on pixels. Artists carry
a `gid` ("<row>:<kind>") for the same reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from harness.report.gate import BY_NAME
from harness.run import metrics

# what ran in a tick, keyed by action (prefill split by what it did)
KIND_STYLE = {
    "decode": ("decode step (classic rows)", "#4C72B0"),
    "admit": ("prefill: classic admission", "#64B5CD"),
    "slice0": ("prefill + slice 0 (speculative admission)", "#E8A33D"),
    "window": ("prefill + slice 0 of a B>1 window", "#E8A33D"),
    "spec_round": ("speculative round", "#DD8452"),
    "fused": ("fused: classic + verify rows", "#8172B3"),
    "burst": ("legacy burst: the whole speculative request", "#C44E52"),
    "park": ("prefill tick that only parks a waiter", "#937860"),
    "chunk": ("prefill: one chunk of a long prompt", "#8DB9CA"),
}
HOL_COLOR = "#F4C7C7"        # a classic row waiting on a speculative action: the HOL wait
WAITING_COLOR = "#E6E6E6"    # live but not served by this tick (queued, parked, another row's prefill)
SPEC_KINDS = frozenset({"slice0", "window", "spec_round", "burst"})
SHORT = {"slice0": "slice 0", "window": "window slice 0", "spec_round": "round", "burst": "whole burst",
         "park": "park", "admit": "admit", "decode": "decode", "fused": "fused", "chunk": "chunk"}
MODE_COLORS = {"burst": "#C44E52", "slice": "#4C72B0", "fused": "#8172B3", "cost": "#55A868"}
_EXTRA_COLORS = ("#DA8BC3", "#8C8C8C", "#CCB974", "#64B5CD")


def mode_color(mode: str, index: int = 0) -> str:
    return MODE_COLORS.get(mode, _EXTRA_COLORS[index % len(_EXTRA_COLORS)])


def tick_kind(tick: Mapping) -> str | None:
    if tick["action"] == "idle":
        return None
    if tick["action"] == "prefill":
        return tick.get("detail") or "admit"
    return tick["action"]


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1] + 1e-9:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


MAX_ROWS = 12  # request rows a timeline panel draws: a tall PNG is unreadable (and slow to render)


def timeline_data(trace: Mapping, max_rows: int = MAX_ROWS) -> dict:
    """Per request row: the ticks that worked on it, the ticks it waited through, its token arrivals.
    At most `max_rows` rows: those live across the longest classic gap (the stall the panel
    annotates), then the earliest arrivals, in arrival order; "shown" says how many of how many."""
    ticks = [(t["start_ms"], t["end_ms"], tick_kind(t), tuple(t["request_ids"])) for t in trace["ticks"]]
    ticks = [t for t in ticks if t[2] is not None and t[1] > t[0]]
    stall = None
    for r in trace["requests"]:
        if r["speculative"] or len(r["token_times_ms"]) < 2:
            continue
        gaps = metrics.itl(r["token_times_ms"])
        i = int(np.argmax(gaps))
        if stall is None or gaps[i] > stall[2] - stall[1]:
            a, b = r["token_times_ms"][i], r["token_times_ms"][i + 1]
            stall = (r["id"], a, b, _spell([kind for s, e, kind, _ in ticks if a < e <= b]))
    rows = {}
    for r in _shown(trace["requests"], stall, max_rows):
        times = r["token_times_ms"]
        done = times[-1] if times else r["arrival_ms"]
        # a finished row of a B>1 window stays in its job's tick ids: draw work only while live
        work = [(a, b, kind) for a, b, kind, ids in ticks if r["id"] in ids and a < done]
        idle = [(max(a, r["arrival_ms"]), b, kind) for a, b, kind, ids in ticks
                if r["id"] not in ids and b > r["arrival_ms"] and a < done]
        hol = [] if r["speculative"] else [(a, b) for a, b, kind in idle if kind in SPEC_KINDS]
        rows[r["id"]] = {"speculative": r["speculative"], "arrival_ms": r["arrival_ms"], "work": work,
                         "hol": _merge(hol), "waiting": _merge([(a, b) for a, b, _ in idle]),
                         "tokens": list(times)}
    return {"scenario": trace["scenario"], "mode": trace["mode"], "ticks": [(a, b, kind) for a, b, kind, _ in ticks],
            "rows": rows, "classic_stall": stall, "shown": (len(rows), len(trace["requests"]))}


def _shown(requests: Sequence[Mapping], stall: tuple | None, max_rows: int) -> list[Mapping]:
    """The requests a panel draws: the stalled row and those live across its gap first, then by arrival."""
    def live_across(r: Mapping) -> bool:
        end = r["token_times_ms"][-1] if r["token_times_ms"] else r["arrival_ms"]
        return stall is not None and r["arrival_ms"] < stall[2] and end > stall[1]
    first = sorted(requests, key=lambda r: (stall is None or r["id"] != stall[0], not live_across(r), r["arrival_ms"]))
    return sorted(first[:max_rows], key=lambda r: r["arrival_ms"])


def _spell(kinds: list[str]) -> str:
    """["slice0", "spec_round", "spec_round", "decode"] -> "slice 0 + 2 x round + decode"."""
    counts: dict[str, int] = {}
    for kind in kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return " + ".join(SHORT.get(k, k) if n == 1 else f"{n} x {SHORT.get(k, k)}" for k, n in counts.items())


def _bars(ax, spans, y, height, color, gid, **kw):
    """The rectangles broken_barh would draw, added without autoscaling: broken_barh rescales the
    shared axes on every call (quadratic in the bars); timeline_figure sets the limits once."""
    if spans:
        y0, y1 = y - height / 2, y - height / 2 + height
        verts = [[(a, y0), (a, y1), (b, y1), (b, y0)] for a, b, *_ in spans]
        ax.add_collection(PolyCollection(np.array(verts), facecolors=color, gid=gid, **kw), autolim=False)


def _annotate_stall(ax, d: dict, span: float) -> None:
    """The longest classic gap, with what ran inside it (the HOL made explicit)."""
    rid, a, b, inside = d["classic_stall"]
    y = list(d["rows"]).index(rid) + 1 - 0.43
    ax.annotate("", xy=(b, y), xytext=(a, y), arrowprops={"arrowstyle": "<->", "color": "#8B0000", "lw": 1.3})
    text = f"longest classic gap {b - a:.1f} ms" + (f" ({inside})" if inside else "")
    wide = b - a > 0.25 * span
    ax.text((a + b) / 2 if wide else b + 0.006 * span, y, text, ha="center" if wide else "left", va="center",
            fontsize=8.5, color="#8B0000", fontweight="bold",
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.85})


def timeline_figure(traces: Sequence[Mapping]) -> tuple[Figure, list[dict]]:
    """One panel per mode (same scenario): a tick row, then a row per request with token arrivals."""
    data = [timeline_data(t) for t in traces]
    num_rows = max(len(d["rows"]) for d in data) + 1
    fig = Figure(figsize=(14, 0.9 + len(data) * (0.55 * num_rows + 0.9)), layout="constrained")
    axes = fig.subplots(len(data), 1, sharex=True, squeeze=False)[:, 0]
    used: set[str] = set()
    span = max((t[1] for d in data for t in d["ticks"]), default=1.0)
    for ax, d in zip(axes, data):
        labels = ["ticks"] + [f"{rid} ({'spec' if row['speculative'] else 'classic'})"
                              for rid, row in d["rows"].items()]
        for kind in {k for _, _, k in d["ticks"]}:
            _bars(ax, [t for t in d["ticks"] if t[2] == kind], 0, 0.7, KIND_STYLE.get(kind, ("", "#999"))[1],
                  f"ticks:{kind}", edgecolor="white", linewidth=0.3)
            used.add(kind)
        for y, (rid, row) in enumerate(d["rows"].items(), start=1):
            _bars(ax, row["waiting"], y, 0.5, WAITING_COLOR, f"{rid}:waiting")
            _bars(ax, row["hol"], y, 0.5, HOL_COLOR, f"{rid}:hol")
            for kind in {k for _, _, k in row["work"]}:
                _bars(ax, [w for w in row["work"] if w[2] == kind], y, 0.5, KIND_STYLE.get(kind, ("", "#999"))[1],
                      f"{rid}:{kind}", edgecolor="white", linewidth=0.3)
            ax.plot(row["tokens"], [y + 0.36] * len(row["tokens"]), linestyle="none", marker="|",
                    markersize=7, color="#222222", markeredgewidth=0.8, gid=f"{rid}:tokens")
        if d["classic_stall"]:
            _annotate_stall(ax, d, span)
        if d["ticks"]:  # every bar lies within the ticks' extent (ax.plot adds the tokens' own)
            ax.update_datalim([(min(t[0] for t in d["ticks"]), 0), (max(t[1] for t in d["ticks"]), 0)], updatey=False)
        ax.set_yticks(range(len(labels)), labels, fontsize=9)
        ax.set_ylim(len(labels) - 0.4, -0.6)
        shown, total = d["shown"]
        more = f" ({shown} of {total} requests: the longest classic gap's, then the first)" if shown < total else ""
        ax.set_title(f"{d['scenario']} - mode {d['mode']}{more}", loc="left", fontsize=11, fontweight="bold")
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[-1].set_xlabel("virtual time (ms)")
    handles = [Patch(color=KIND_STYLE[k][1], label=KIND_STYLE[k][0]) for k in KIND_STYLE if k in used]
    handles += [Patch(color=HOL_COLOR, label="classic row waiting on a speculative action (HOL)"),
                Patch(color=WAITING_COLOR, label="live, not served (queued, parked, other prefill)"),
                axes[0].plot([], [], linestyle="none", marker="|", color="#222222", label="token arrival")[0]]
    fig.legend(handles=handles, loc="outside upper center", ncol=4, fontsize=8.5, frameon=False)
    return fig, data


def classic_gaps(trace: Mapping) -> list[float]:
    return [g for r in trace["requests"] if not r["speculative"] for g in metrics.itl(r["token_times_ms"])]


def itl_cdf_figure(traces: Sequence[Mapping]) -> tuple[Figure, dict]:
    """Classic ITL CDF, one panel per scenario with classic rows, one line per mode (dotted: its bound)."""
    by_scenario: dict[str, dict[str, list[float]]] = {}
    bounds: dict[str, dict[str, float]] = {}
    for t in traces:
        gaps = classic_gaps(t)
        if gaps:
            by_scenario.setdefault(t["scenario"], {})[t["mode"]] = sorted(gaps)
        for c in t["checks"]:
            if c["name"] == "classic_itl" and c.get("expect") == "pass" and c.get("bound") is not None:
                bounds.setdefault(t["scenario"], {})[t["mode"]] = c["bound"]
    n = max(len(by_scenario), 1)
    cols = min(n, 2)
    rows = (n + cols - 1) // cols
    fig = Figure(figsize=(7 * cols, 3.8 * rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False).ravel())
    for ax, (scenario, modes) in zip(axes, sorted(by_scenario.items())):
        for i, (mode, gaps) in enumerate(modes.items()):
            color = mode_color(mode, i)
            y = np.arange(1, len(gaps) + 1) / len(gaps)
            bound = bounds.get(scenario, {}).get(mode)
            label = f"{mode}: max {gaps[-1]:.0f} ms" + (f", bound {bound:.0f}" if bound is not None else "")
            ax.step(gaps, y, where="post", color=color, lw=1.8, label=label, gid=f"cdf:{mode}")
            if bound is not None:
                ax.axvline(bound, color=color, ls=":", lw=1.1)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator([1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(scenario, loc="left", fontweight="bold")
        ax.set_xlabel("classic inter-token gap (ms, log scale)")
        ax.set_ylabel("fraction of gaps <= x")
        ax.set_ylim(0, 1.02)
        ax.grid(color="#e5e5e5", which="both", lw=0.6)
        ax.legend(fontsize=8.5, loc="lower right", title_fontsize=7.5,
                  title="mode (dotted: checked bound; admission gaps add slice 0)")
    for ax in axes[len(by_scenario):]:
        ax.set_visible(False)
    return fig, {"gaps": by_scenario, "bounds": bounds}


def _mode_order(modes) -> list[str]:
    """The known modes in their story order (burst, slice, fused, cost), then any new one."""
    return sorted(modes, key=lambda m: (list(MODE_COLORS).index(m) if m in MODE_COLORS else len(MODE_COLORS), m))


def _log_if_wide(ax, values) -> None:
    """Log scale when the legacy burst would flatten the other modes into the x axis."""
    positive = [v for v in values if v is not None and v > 0]
    if positive and max(positive) / min(positive) > 20:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.text(0.99, 0.02, "log scale", transform=ax.transAxes, ha="right", fontsize=7, color="#777777")


def trend_figure(metric: str, runs: Sequence, baseline: Mapping) -> tuple[Figure, dict]:
    """One tracked metric across the stored runs: a panel per scenario, a line per mode, baseline dashed."""
    scenarios = sorted({s for run in runs for s in run.tracked} | set(baseline))
    series: dict[str, dict[str, list]] = {}
    for s in scenarios:
        modes = _mode_order({m for run in runs for m in run.tracked.get(s, {})} | set(baseline.get(s, {})))
        values = {m: [run.tracked.get(s, {}).get(m, {}).get(metric) for run in runs] for m in modes}
        base = {m: baseline.get(s, {}).get(m, {}).get(metric) for m in modes}
        if any(v is not None for vs in values.values() for v in vs) or any(v is not None for v in base.values()):
            series[s] = {"values": values, "baseline": base}
    info = BY_NAME[metric]
    n = max(len(series), 1)
    fig = Figure(figsize=(3.4 * n + 0.6, 3.3), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    x = np.arange(len(runs))
    for ax, (s, d) in zip(axes, series.items()):
        for i, (mode, values) in enumerate(d["values"].items()):
            color = mode_color(mode, i)
            ys = np.array([np.nan if v is None else v for v in values], float)
            # drawn biggest first, so modes with equal values stay visible as concentric markers
            ax.plot(x, ys, marker="o", ms=max(10 - 2 * i, 3), lw=max(3.2 - 0.7 * i, 1.0), color=color,
                    label=mode, gid=f"trend:{s}:{mode}")
            if d["baseline"].get(mode) is not None:
                ax.axhline(d["baseline"][mode], color=color, ls="--", lw=0.9, alpha=0.7)
        _log_if_wide(ax, [v for vs in d["values"].values() for v in vs] + list(d["baseline"].values()))
        ax.set_title(s, loc="left", fontsize=10, fontweight="bold")
        ax.set_xticks(x, [run.label for run in runs], fontsize=7)
        ax.set_xlim(-0.5, max(len(runs) - 0.5, 0.5))
        ax.grid(color="#e5e5e5", lw=0.6)
        ax.margins(y=0.15)
    axes[0].set_ylabel(info.unit)
    axes[0].legend(fontsize=8, title="mode (dashed: baseline)", title_fontsize=7.5)
    if not runs:
        fig.text(0.5, 0.5, "no stored bench runs yet: tox -e bench", ha="center", fontsize=12, color="#8B0000")
    better = "higher" if info.higher_is_better else "lower"
    fig.suptitle(f"{info.title} ({info.unit}, {better} is better)", x=0.01, ha="left", fontsize=11)
    return fig, series


def wall_figure(runs: Sequence) -> tuple[Figure, dict]:
    """Wall-time figures across the stored runs: reported, never gated."""
    groups = {"tick us": "one tick (us, zero-cost mock)", "tokens per CPU-s": "simulated tokens per CPU-second",
              "virtual/wall": "virtual time / wall time"}
    fig = Figure(figsize=(15, 3.4), layout="constrained")
    axes = fig.subplots(1, len(groups), squeeze=False)[0]
    x = np.arange(len(runs))
    series = {}
    for ax, (prefix, title) in zip(axes, groups.items()):
        names = sorted({n for run in runs for n in run.wall if n.startswith(prefix)},
                       key=lambda n: (len(n), n))
        for i, name in enumerate(names):
            ys = [run.wall.get(name) for run in runs]
            series[name] = ys
            ax.plot(x, [np.nan if v is None else v for v in ys], marker="o", ms=4, lw=1.4,
                    label=name.split(": ", 1)[1], color=f"C{i}")
        ax.set_title(title, loc="left", fontsize=10, fontweight="bold")
        ax.set_xticks(x, [run.label for run in runs], fontsize=7)
        ax.set_xlim(-0.5, max(len(runs) - 0.5, 0.5))
        ax.grid(color="#e5e5e5", lw=0.6)
        if names:
            ax.legend(fontsize=7.5)
    fig.suptitle("wall-time figures (this machine; reported, never gated)", x=0.01, ha="left", fontsize=11)
    return fig, series
