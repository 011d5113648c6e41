"""`coopsched report`: index.html (opens from disk) with PNG plots, summary.md, data.json.

Runs every scenario in every mode of `coopsched run` (virtual time, seed 0),
reads the stored bench runs (reports/benchmarks/, pytest-benchmark's files) for
the trends, and compares the tracked metrics with the committed baseline.
`--update-baseline` moves reports/baseline/ to the current metrics on purpose.
The latest `coopsched sweep` (reports/sweeps/latest.json), when there is one, gets a section.
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import json
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from coopsched.core import MODES
from harness.report import gate, history, plots, sweep_page
from harness.run import runner, scenario
from harness.sweep.cli import STORE as SWEEP_STORE
from harness.verdict.check import Tally, state

DEFAULT_OUT = Path("reports") / "latest"
TIMELINE_SCENARIO = "concurrency2"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                        help=f"where index.html, summary.md and the PNGs go (default {DEFAULT_OUT})")
    parser.add_argument("--storage", type=Path, default=history.DEFAULT_STORAGE, metavar="DIR",
                        help=f"pytest-benchmark storage with the stored runs (default {history.DEFAULT_STORAGE})")
    parser.add_argument("--baseline", type=Path, default=gate.BASELINE_DIR, metavar="DIR",
                        help="the committed baseline the gate compares with (default reports/baseline)")
    parser.add_argument("--update-baseline", action="store_true",
                        help="move the baseline to the current tracked metrics (commit the result)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the scenario runs (default 0)")
    parser.add_argument("--sweep", type=Path, default=SWEEP_STORE, metavar="PATH",
                        help=f"the sweep JSON to show (default {SWEEP_STORE}, the latest coopsched sweep, "
                             "when it exists; a path given must exist)")


def git_commit(short: bool = False) -> str | None:
    try:
        cmd = ["git", "rev-parse", *(["--short"] if short else []), "HEAD"]
        return subprocess.run(cmd, capture_output=True, text=True, check=True,
                              cwd=gate.REPO_ROOT).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def collect_traces(seed: int = 0, console: Console | None = None) -> list[dict]:
    """Every scenario x every mode `coopsched run` knows (read now: modes get added)."""
    pairs = [(name, mode) for name in scenario.available() for mode in MODES]
    traces = []
    with Progress(console=console or Console(stderr=True), transient=True) as progress:
        task = progress.add_task("scenarios x modes", total=len(pairs))
        for name, mode in pairs:
            progress.update(task, description=f"{name} / {mode}")
            traces.append(runner.run_scenario(scenario.load(name), mode, seed))
            progress.advance(task)
    return traces


@dataclass
class Report:
    out: Path
    traces: list[dict]
    metrics: dict
    findings: list
    runs: list
    baseline: dict
    baseline_dir: Path = gate.BASELINE_DIR
    images: dict[str, str] = field(default_factory=dict)   # key -> file name
    sweep: dict | None = None                              # the latest coopsched sweep, shown when stored
    plotted: dict = field(default_factory=dict)           # key -> the data each figure plotted

    @property
    def tally(self) -> Tally:
        """Held, failed and skipped checks over every trace (a skipped one never counts as holding)."""
        return Tally.of((f"{t['scenario']}/{t['mode']}/{c['name']}", c) for t in self.traces for c in t["checks"])

    @property
    def gate_failures(self) -> list:
        return gate.failures(self.findings)


def _save(fig, path: Path) -> None:
    fig.savefig(path, dpi=110, facecolor="white")


def build(out: Path = DEFAULT_OUT, storage: Path = history.DEFAULT_STORAGE,
          baseline_dir: Path = gate.BASELINE_DIR, seed: int = 0, console: Console | None = None,
          traces: list[dict] | None = None, sweep_path: Path | None = SWEEP_STORE) -> Report:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    traces = traces if traces is not None else collect_traces(seed, console)
    metrics = gate.metrics_of(traces)
    baseline = gate.load_baseline(baseline_dir)
    report = Report(out, traces, metrics, gate.compare(metrics, baseline), history.load_runs(storage), baseline,
                    Path(baseline_dir), sweep=sweep_page.load(sweep_path) if sweep_path else None)
    figures = []
    by_scenario: dict[str, list[dict]] = {}
    for t in traces:
        by_scenario.setdefault(t["scenario"], []).append(t)
    for name in sorted(by_scenario, key=lambda n: (n != TIMELINE_SCENARIO, n)):
        figures.append((f"timeline:{name}", f"timeline_{name}.png", plots.timeline_figure(by_scenario[name])))
    figures.append(("itl_cdf", "classic_itl_cdf.png", plots.itl_cdf_figure(traces)))
    for metric in gate.TRACKED:
        figures.append((f"trend:{metric.name}", f"trend_{metric.name}.png",
                        plots.trend_figure(metric.name, report.runs, baseline)))
    figures.append(("wall", "trend_wall_time.png", plots.wall_figure(report.runs)))
    for key, name, (fig, data) in figures:
        _save(fig, out / name)
        report.images[key], report.plotted[key] = name, data
    if report.sweep is not None:
        for key, (name, data) in sweep_page.render_figures(report.sweep, out).items():
            report.images[f"sweep:{key}"], report.plotted[f"sweep:{key}"] = name, data
    (out / "index.html").write_text(render_html(report))
    (out / "summary.md").write_text(render_markdown(report))
    (out / "data.json").write_text(json.dumps({
        "metrics": metrics, "baseline": baseline,
        "checks": {f"{t['scenario']}/{t['mode']}": t["checks"] for t in traces},
        "gate": [f.__dict__ for f in report.findings],
        "stored_runs": [{"path": str(r.path), "commit": r.commit, "datetime": r.datetime} for r in report.runs],
        "images": report.images, "plotted": report.plotted,  # what each figure drew, for tests and tools
        "sweep": report.sweep and {"path": str(sweep_path), "scenario": report.sweep["scenario"],
                                   "capacity": report.sweep["capacity"]},
    }, default=str) + "\n")
    return report


# -- rendering ----------------------------------------------------------------
def _fmt(v, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 and digits > 1 else f"{v:.{digits}f}"
    return str(v)


def _modes(report: Report) -> list[str]:
    seen = []
    for t in report.traces:
        if t["mode"] not in seen:
            seen.append(t["mode"])
    return seen


def headline(report: Report) -> str:
    """The one-line story: the classic stall of concurrency2 in each mode."""
    stalls = report.metrics.get(TIMELINE_SCENARIO, {})
    parts = [f"{mode} {stalls[mode]['classic_itl_max_ms']:.0f} ms" for mode in _modes(report)
             if stalls.get(mode, {}).get("classic_itl_max_ms") is not None]
    return f"classic stall beside a speculative request ({TIMELINE_SCENARIO}): " + ", ".join(parts)


def _verdicts(report: Report) -> list[tuple[bool | None, str, str]]:
    """(ok, title, text) per headline; ok None: nothing to judge yet (shown as "--", not a failure)."""
    info = gate.baseline_info(report.baseline_dir)
    tally, gated = report.tally, report.gate_failures
    failed = tally.failed
    new = sorted({f.key.rsplit("/", 1)[0] for f in report.findings if f.verdict == "new"})
    better = sum(f.verdict == "better" for f in report.findings)
    base = f"baseline {(info.get('commit') or '?')[:10]}" if report.baseline else "no baseline committed"
    return [
        (False if failed else (None if tally.skipped else True), "checks",  # skipped: "--", never "ok"
         tally.line(len(report.traces)) + (f"; FAILED: {', '.join(failed)}" if failed else "")),
        (not gated and bool(report.baseline), "regression gate",
         (f"{len(gated)} tracked metric(s) worse than the {base} by more than 1%" if gated else
          f"every tracked metric within 1% of the {base}") + (f" (not gated yet: {', '.join(new)})" if new else "")
         + (f"; {better} better than it: `coopsched report --update-baseline` locks them in" if better else "")),
        (True, "stall", headline(report)),
        (True, "history", f"{len(report.runs)} stored bench run(s) in the trends") if report.runs else
        (None, "history", "no stored bench runs yet: each `tox -e bench` stores one for the trends"),
    ]


VERDICT_WORD = {True: "ok", False: "FAIL", None: "--"}
CARD_CLASS = {True: "ok", False: "bad", None: ""}

CSS = """
body{font-family:-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1560px;
color:#222;padding:0 20px}
h1{margin:0 0 4px}h2{margin-top:36px;border-bottom:2px solid #eee;padding-bottom:4px}
.meta{color:#666;font-size:13px;margin-bottom:14px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(330px,1fr));gap:10px;margin:12px 0}
.card{border-radius:6px;padding:10px 14px;border-left:6px solid #4C72B0;background:#f5f7fb}
.card.ok{border-color:#2e8b57;background:#eef8f1}.card.bad{border-color:#c0392b;background:#fdeeee}
.card b{display:block;font-size:12px;text-transform:uppercase;color:#555;letter-spacing:.04em}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f3f3f3}
td.l,th.l{text-align:left}.ok{color:#1e7b45}.bad{color:#c0392b;font-weight:bold}.skip{color:#888}
td.worse{background:#fbdcdc}td.better{background:#ddf3e4}td.new{background:#eef}
img{max-width:100%;border:1px solid #eee;margin:6px 0}nav a{margin-right:14px}
code{background:#f3f3f3;padding:1px 4px;border-radius:3px}
"""


def _metrics_table(report: Report) -> str:
    verdict = {f.key: f.verdict for f in report.findings}
    head = "".join(f"<th title='{html.escape(m.title)}'>{m.name}</th>" for m in gate.TRACKED)
    rows = []
    for t in report.traces:
        s, mode = t["scenario"], t["mode"]
        values = report.metrics[s][mode]
        cells = "".join(f"<td class='{verdict.get(f'{s}/{mode}/{m.name}', '')}'>"
                        f"{_fmt(values[m.name], 3 if m.unit == 'ratio' else 1)}</td>" for m in gate.TRACKED)
        rows.append(f"<tr><td class='l'>{s}</td><td class='l'>{mode}</td>{cells}</tr>")
    return (f"<table id='metrics'><tr><th class='l'>scenario</th><th class='l'>mode</th>{head}</tr>"
            + "".join(rows) + "</table>")


def _checks_tables(report: Report) -> str:
    modes = _modes(report)
    by = {(t["scenario"], t["mode"]): t["checks"] for t in report.traces}
    scenarios = sorted({t["scenario"] for t in report.traces})
    matrix = ["<table id='checks-matrix'><tr><th class='l'>scenario</th>"
              + "".join(f"<th>{m}</th>" for m in modes) + "</tr>"]
    for s in scenarios:
        cells = []
        for m in modes:
            checks = by.get((s, m), [])
            counts = Counter(state(c) for c in checks)
            cls = "bad" if counts["failed"] else ("skip" if counts["skipped"] else "ok")
            skipped = f", {counts['skipped']} skipped" if counts["skipped"] else ""
            cells.append(f"<td class='{cls}' data-scenario='{s}' data-mode='{m}'>"
                         f"{counts['held']}/{len(checks)} ok{skipped}</td>")
        matrix.append(f"<tr><td class='l'>{s}</td>{''.join(cells)}</tr>")
    matrix.append("</table>")
    detail = ["<table id='checks'><tr><th class='l'>scenario</th><th class='l'>mode</th><th class='l'>check</th>"
              "<th>value</th><th>bound</th><th class='l'>expectation</th><th class='l'>result</th>"
              "<th class='l'>note</th></tr>"]
    for t in report.traces:
        for c in t["checks"]:
            result = {"skipped": "<span class='skip'>skipped</span>", "held": "<span class='ok'>pass</span>",
                      "failed": "<span class='bad'>FAIL</span>"}[state(c)]
            expect = "must hold" if c.get("expect", "pass") == "pass" else "must fail (legacy)"
            detail.append(f"<tr data-scenario='{t['scenario']}' data-mode='{t['mode']}'>"
                          f"<td class='l'>{t['scenario']}</td><td class='l'>{t['mode']}</td>"
                          f"<td class='l'>{c['name']}</td><td>{_fmt(c['value'])}</td><td>{_fmt(c['bound'])}</td>"
                          f"<td class='l'>{expect}</td><td class='l'>{result}</td>"
                          f"<td class='l'>{html.escape(c.get('note', ''))}</td></tr>")
    detail.append("</table>")
    return "".join(matrix) + "".join(detail)


GLANCE = ("classic_itl_max_ms", "classic_itl_p99_ms", "burst_wall_ms", "spec_ttft_p95_ms", "aggregate_tok_s",
          "spec_tok_s", "acceptance")


def _glance_table(report: Report) -> str:
    """concurrency2 side by side per mode, aggregate throughput relative to the legacy burst."""
    rows = report.metrics.get(TIMELINE_SCENARIO, {})
    if not rows:
        return ""
    legacy = rows.get("burst", {}).get("aggregate_tok_s")
    head = "".join(f"<th>{html.escape(gate.BY_NAME[m].title)}</th>" for m in GLANCE)
    body = []
    for mode in _modes(report):
        values = rows.get(mode, {})
        cells = "".join(f"<td>{_fmt(values.get(m), 3 if gate.BY_NAME[m].unit == 'ratio' else 1)}</td>" for m in GLANCE)
        ratio = values.get("aggregate_tok_s")
        vs = f"{ratio / legacy:.2f}x" if legacy and ratio else "-"
        body.append(f"<tr><td class='l'><b>{mode}</b></td>{cells}<td>{vs}</td></tr>")
    return (f"<table id='glance'><caption style='text-align:left'>{TIMELINE_SCENARIO} at a glance "
            f"(virtual ms, tokens/s)</caption><tr><th class='l'>mode</th>{head}<th>aggregate vs burst</th></tr>"
            + "".join(body) + "</table>")


def _sweep_section(report: Report) -> str:
    if report.sweep is None:
        return ""
    images = {k.split(":", 1)[1]: v for k, v in report.images.items() if k.startswith("sweep:")}
    return (f"<h2 id='sweep-section'>Latest sweep: capacity per mode under a per-token SLO</h2>"
            f"{sweep_page.section(report.sweep, images)}<p class='meta'>Stored by <code>coopsched sweep</code> "
            "(reports/sweeps/latest.json, replaced by the next sweep).</p>")


def render_html(report: Report) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cards = "".join(f"<div class='card {CARD_CLASS[ok]}'><b>{html.escape(title)}</b>{html.escape(text)}</div>"
                    for ok, title, text in _verdicts(report))
    gated = report.gate_failures
    gate_list = ("<ul>" + "".join(f"<li class='bad'>{html.escape(f.describe())}</li>" for f in gated) + "</ul>"
                 if gated else "")
    img = lambda key, alt: (f"<img src='{report.images[key]}' alt='{html.escape(alt)}'>"
                            if key in report.images else "")
    timelines = [k for k in report.images if k.startswith("timeline:")]
    trends = "".join(img(f"trend:{m.name}", m.title) for m in gate.TRACKED)
    others = "".join(f"<h3>{k.split(':', 1)[1]}</h3>{img(k, k)}" for k in timelines[1:])
    sweep_link = '<a href="#sweep-section">latest sweep</a>' if report.sweep is not None else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>coopsched report</title><style>{CSS}</style></head>
<body>
<h1>coopsched report</h1>
<div class="meta">commit {git_commit(short=True) or 'unknown'} &middot; generated {now} &middot;
{len({t['scenario'] for t in report.traces})} scenarios x {len(_modes(report))} modes ({', '.join(_modes(report))}),
virtual time, seed {report.traces[0].get('seed', 0) if report.traces else 0}</div>
<nav><a href="#timeline">1 timeline</a><a href="#cdf">2 classic ITL CDF</a><a href="#trends">3 trends</a>
<a href="#checks-section">4 checks</a><a href="#metrics-section">tracked metrics</a>{sweep_link}</nav>
<div class="cards">{cards}</div>{gate_list}
{_glance_table(report)}
<h2 id="timeline">1. Tick timeline: {TIMELINE_SCENARIO}, one panel per mode</h2>
<p>Top row: which action each tick ran. Below, one row per request: the ticks that worked on it (coloured),
the ticks it sat through while live (grey; pale red for a classic row while a speculative action runs: the HOL
wait), and each token arrival (black ticks). In <b>burst</b> mode the classic row is idle for the whole
speculative request.</p>
{img(timelines[0], 'tick timeline') if timelines else ''}
<h2 id="cdf">2. Classic inter-token latency, CDF per mode</h2>{img('itl_cdf', 'classic ITL CDF')}
<h2 id="trends">3. Tracked metrics across the stored bench runs ({len(report.runs)})</h2>
<p>Virtual time, exact: gated against the committed baseline (dashed) at 1%. Stored runs come from
<code>tox -e bench</code> (pytest-benchmark storage, one file per run, named with the commit).</p>
{trends}{img('wall', 'wall-time figures')}
<h2 id="checks-section">4. Checks</h2>{_checks_tables(report)}
<h2 id="metrics-section">Tracked metrics of this tree</h2>
<p>Coloured against the baseline in <code>{html.escape(str(report.baseline_dir))}</code>: red worse by more than 1%,
green better, blue not in the baseline yet.</p>{_metrics_table(report)}
<h2>Timelines of the other scenarios</h2>{others}
{_sweep_section(report)}
<p class="meta">Regenerate: <code>coopsched report</code>. Move the baseline on purpose:
<code>coopsched report --update-baseline</code>, then commit reports/baseline/.</p>
</body></html>
"""


def render_markdown(report: Report) -> str:
    lines = ["# coopsched report", ""]
    lines += [f"- **{title}**: {VERDICT_WORD[ok]}: {text}" for ok, title, text in _verdicts(report)]
    lines += [f"  - {f.describe()}" for f in report.gate_failures]
    lines += ["", "## Tracked metrics (virtual time, seed 0)", "",
              "| scenario | mode | " + " | ".join(m.name for m in gate.TRACKED) + " |",
              "|---|---|" + "---:|" * len(gate.TRACKED)]
    for t in report.traces:
        values = report.metrics[t["scenario"]][t["mode"]]
        lines.append(f"| {t['scenario']} | {t['mode']} | "
                     + " | ".join(_fmt(values[m.name], 3 if m.unit == "ratio" else 1) for m in gate.TRACKED) + " |")
    lines += ["", "## Checks", "", "| scenario | mode | checks held | failed | skipped |", "|---|---|---:|---|---|"]
    for t in report.traces:
        bad = [c["name"] for c in t["checks"] if state(c) == "failed"]
        skipped = [c["name"] for c in t["checks"] if state(c) == "skipped"]
        held = len(t["checks"]) - len(bad) - len(skipped)
        lines.append(f"| {t['scenario']} | {t['mode']} | {held}/{len(t['checks'])} | "
                     f"{', '.join(bad) or '-'} | {', '.join(skipped) or '-'} |")
    if report.sweep is not None:
        lines += ["", "## Latest sweep", "", sweep_page.describe(report.sweep), "",
                  "capacity: " + ", ".join(f"{mode} {'none' if load is None else f'{load:g}'}"
                                           for mode, load in report.sweep["capacity"].items())]
    lines += ["", f"Open `{report.out / 'index.html'}` for the plots."]
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    console = Console()
    if args.sweep != SWEEP_STORE and not args.sweep.is_file():  # the default may be absent; a path given must not
        console.print(f"[red]error:[/] --sweep {escape(str(args.sweep))}: no such file (a sweep JSON: coopsched "
                      "sweep ... --json PATH)", soft_wrap=True, highlight=False)
        return 2
    traces = collect_traces(args.seed, console)
    if args.update_baseline:
        written = gate.write_baseline(gate.metrics_of(traces), args.baseline, commit=git_commit(), seed=args.seed)
        console.print(f"baseline moved: {len(written)} file(s) in {args.baseline}; commit them with the change",
                      soft_wrap=True)
    report = build(args.out, args.storage, args.baseline, args.seed, console, traces=traces, sweep_path=args.sweep)
    for ok, title, text in _verdicts(report):
        style = {True: "green", False: "red", None: "yellow"}[ok]
        console.print(f"[{style}]{VERDICT_WORD[ok]}[/]  {title}: {text}", highlight=False, soft_wrap=True)
    for f in report.gate_failures:
        console.print(f"   [red]{f.verdict}[/] {f.describe()}", highlight=False, soft_wrap=True)
    if report.sweep is not None:
        console.print(f"latest sweep: {sweep_page.describe(report.sweep)}", highlight=False, soft_wrap=True)
    console.print(f"report: {report.out / 'index.html'}  (summary: {report.out / 'summary.md'})", soft_wrap=True)
    return 0
