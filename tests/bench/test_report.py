"""`coopsched report`: two stored bench runs in the trends, valid PNGs, every scenario x mode checked,
and the burst timeline showing the classic row idle for the whole burst (on the plotted data).
The reports are built once a session (tests/bench/conftest.py: `built`, `bare`)."""

from __future__ import annotations

import copy
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from coopsched import cli
from coopsched.core import MODES
from harness.report import build as report
from harness.report import gate, history, plots
from harness.run import runner, scenario

pytestmark = pytest.mark.bench
REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.cells: dict[str, set[tuple[str, str]]] = {}
        self._table = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        elif tag == "table":
            self._table = attrs.get("id")
        elif "data-scenario" in attrs and self._table:
            self.cells.setdefault(self._table, set()).add((attrs["data-scenario"], attrs["data-mode"]))


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text())
    return page


def test_two_bench_runs_are_two_stored_files_named_with_the_commit(built):
    storage, _, _ = built
    files = sorted(storage.glob("*/*.json"))
    assert [f.name[:5] for f in files] == ["0001_", "0002_"]
    for f in files:  # pytest-benchmark's autosave name: <counter>_<commit>_<date>[_uncommit(t)ed-changes]
        named = re.fullmatch(r"\d{4}_([0-9a-f]{40}|unversioned)_\d{8}_\d{6}(_uncommit+ed-changes)?\.json", f.name)
        assert named, f.name
        if named[1] != "unversioned":  # a commit of this repository (HEAD may have moved since)
            subprocess.run(["git", "cat-file", "-e", f"{named[1]}^{{commit}}"], cwd=REPO, check=True)
    runs = history.load_runs(storage)
    assert len(runs) == 2 and all(r.tracked["concurrency2"].keys() == set(MODES) for r in runs)


def test_the_trend_plots_show_both_runs(built):
    _, _, data = built
    assert len(data["stored_runs"]) == 2
    for metric in ("classic_itl_max_ms", "burst_wall_ms", "aggregate_tok_s", "acceptance"):
        series = data["plotted"][f"trend:{metric}"]["concurrency2"]["values"]
        for mode in MODES:
            assert len(series[mode]) == 2 and None not in series[mode], (metric, mode)
    assert len(data["plotted"]["wall"]["tick us: B=1"]) == 2


def test_every_image_the_html_references_exists_and_is_a_valid_png(built):
    _, out, _ = built
    page = parse(out / "index.html")
    assert len(page.images) >= 3 + len(gate.TRACKED)
    for src in page.images:
        assert not src.startswith(("/", "http:", "https:", "file:")), f"{src}: must open from disk, relative"
        path = out / src
        assert path.is_file(), src
        assert path.read_bytes()[:8] == PNG_SIGNATURE, src
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            assert image.format == "PNG" and min(image.size) > 100, src


def test_the_checks_table_lists_every_scenario_x_mode(built):
    _, out, _ = built
    page = parse(out / "index.html")
    everything = {(s, m) for s in scenario.available() for m in MODES}
    assert page.cells["checks"] == everything
    assert page.cells["checks-matrix"] == everything


def test_the_markdown_summary_has_the_verdicts_and_every_run(built):
    _, out, _ = built
    text = (out / "summary.md").read_text()
    assert "**checks**: ok" in text and "**regression gate**: ok" in text
    for s in scenario.available():
        for m in MODES:
            assert f"| {s} | {m} |" in text


def classic_idle_during_burst(timeline: dict) -> tuple[bool, str]:
    """Whether every classic row gets no token and no work during each burst tick, and waits through it."""
    bursts = [(a, b) for a, b, kind in timeline["ticks"] if kind == "burst"]
    if not bursts:
        return False, "no burst tick plotted"
    for rid, row in timeline["rows"].items():
        if row["speculative"]:
            continue
        for a, b in bursts:
            tokens = [t for t in row["tokens"] if a < t < b]
            work = [(s, e) for s, e, _ in row["work"] if s < b and e > a]
            covered = sum(min(e, b) - max(s, a) for s, e in row["hol"] if s < b and e > a)
            if tokens or work or abs(covered - (b - a)) > 1e-6:
                return False, f"{rid} during the burst {a}-{b}: tokens {tokens[:3]}, work {work[:3]}"
    return True, f"classic rows idle through {len(bursts)} burst(s)"


def test_the_burst_timeline_shows_the_classic_row_idle_during_the_burst(built):
    _, _, data = built
    panels = {d["mode"]: d for d in data["plotted"][f"timeline:{report.TIMELINE_SCENARIO}"]}
    idle, why = classic_idle_during_burst(panels["burst"])
    assert idle, why
    (a, b), = [(s, e) for s, e, kind in panels["burst"]["ticks"] if kind == "burst"]
    assert b - a > 500  # the whole speculative request: hundreds of ms of virtual time
    # the same predicate fails on slice mode: there the classic row is served between rounds
    sliced = panels["slice"]
    spec = next(row for row in sliced["rows"].values() if row["speculative"])
    assert not classic_idle_during_burst(sliced)[0]
    assert any(spec["tokens"][0] < t < spec["tokens"][-1] for t in sliced["rows"]["classic"]["tokens"])


def test_the_plotted_artists_carry_that_same_data():
    """The figure's own artists (what was drawn) hold the data the report records."""
    traces = [runner.run_scenario(scenario.load(report.TIMELINE_SCENARIO), m, 0) for m in MODES]
    fig, data = plots.timeline_figure(traces)
    axis = {ax.get_title(loc="left").rsplit(" ", 1)[-1]: ax for ax in fig.axes if ax.get_title(loc="left")}
    burst = axis["burst"]
    tokens = next(line for line in burst.get_lines() if line.get_gid() == "classic:tokens")
    burst_bar = next(c for c in burst.collections if c.get_gid() == "ticks:burst")
    (x0, _), (x1, _) = burst_bar.get_paths()[0].get_extents().get_points()
    assert x1 - x0 > 500
    assert not [x for x in tokens.get_xdata() if x0 < x < x1]
    assert [list(line.get_xdata()) for line in burst.get_lines() if line.get_gid() == "classic:tokens"] == \
        [next(d for d in data if d["mode"] == "burst")["rows"]["classic"]["tokens"]]


def test_a_timeline_of_many_requests_draws_the_stalled_row_and_those_beside_it():
    """poisson-mix has 160 requests: a panel draws MAX_ROWS of them (one row each was a 39000-pixel
    PNG), the stalled classic row and the rows live across its gap first, and its title says so."""
    trace = runner.run_scenario(scenario.load("poisson-mix"), "burst", 0)
    d = plots.timeline_data(trace)
    rid, a, b, _ = d["classic_stall"]
    assert d["shown"] == (plots.MAX_ROWS, len(trace["requests"])) and len(trace["requests"]) > plots.MAX_ROWS
    assert rid in d["rows"]
    across = [r for r in d["rows"].values() if r["arrival_ms"] < b and (r["tokens"] or [r["arrival_ms"]])[-1] > a]
    assert len(across) > 1
    arrivals = [r["arrival_ms"] for r in d["rows"].values()]
    assert arrivals == sorted(arrivals)
    fig, _ = plots.timeline_figure([trace])
    assert f"{plots.MAX_ROWS} of {len(trace['requests'])} requests" in fig.axes[0].get_title(loc="left")


def test_a_worsened_baseline_turns_the_gate_card_red_naming_the_metric(tmp_path):
    traces = [runner.run_scenario(scenario.load(report.TIMELINE_SCENARIO), m, 0) for m in MODES]
    metrics = gate.metrics_of(traces)
    better = copy.deepcopy(metrics)
    better["concurrency2"]["slice"]["classic_itl_p99_ms"] *= 0.9  # the baseline was better: now worse
    worse = report.Report(tmp_path, traces, metrics, gate.compare(metrics, better), [], better, tmp_path,
                          images={"itl_cdf": "x.png", "wall": "w.png"})
    page = report.render_html(worse)
    assert "concurrency2/slice/classic_itl_p99_ms" in page and "card bad" in page
    assert "concurrency2/slice/classic_itl_p99_ms" in report.render_markdown(worse)


def test_no_stored_runs_is_not_a_failure_and_a_missing_sweep_path_is_one_line(bare, tmp_path, capsys):
    fresh, out = bare
    history_verdict = next(v for v in report._verdicts(fresh) if v[1] == "history")
    assert history_verdict[0] is None and "no stored bench runs yet" in history_verdict[2]
    assert "**history**: --:" in (out / "summary.md").read_text()

    assert cli.main(["report", "--out", str(tmp_path / "r"), "--sweep", str(tmp_path / "nothere.json")]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "--sweep" in out and "nothere.json: no such file" in out
