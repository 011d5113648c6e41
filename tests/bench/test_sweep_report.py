"""`coopsched sweep --out DIR` (page, PNGs, the plotted data) and the latest sweep in `coopsched report`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import mixed_workload

from coopsched.cli import main as cli
from harness.report import build as report
from harness.report import sweep_page
from harness.run import runner, scenario
from harness.sweep.cli import STORE

pytestmark = pytest.mark.bench
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MIXED = mixed_workload()


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One small sweep with --out, run in its own working directory (where it is stored)."""
    where = tmp_path_factory.mktemp("sweep")
    (where / "mixed.toml").write_text(MIXED)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(where)
        assert cli(["sweep", "mixed.toml", "--rates", "2,6", "--seeds", "2", "--slo", "itl_ms=250,ttft_ms=1000",
                    "--json", "s.json", "--out", "page"]) == 0
    return where, json.loads((where / "s.json").read_text())


def test_out_writes_the_json_the_page_and_three_pngs(swept):
    where, _ = swept
    page = where / "page"
    assert (page / "sweep.json").read_bytes() == (where / "s.json").read_bytes() == (where / STORE).read_bytes()
    for _, name, _ in sweep_page.FIGURES:
        assert (page / name).read_bytes()[:8] == PNG_SIGNATURE
        assert f"src='{name}'" in (page / "index.html").read_text()
    html = (page / "index.html").read_text()
    assert "id='sweep-capacity'" in html and html.count("<tr>") == 1 + 4 + 1 + 4 * 2  # capacity, mode x load


def test_the_figures_plot_the_summary_and_draw_the_slo(swept):
    _, sweep = swept
    _, latency = sweep_page.latency_figure(sweep)
    assert latency["slo"] == {"itl_ms": 250.0, "ttft_ms": 1000.0}
    for key in ("classic_itl_p99_ms", "classic_itl_max_ms", "ttft_p95_ms"):
        for mode, rows in sweep["summary"].items():
            assert latency["series"][key][mode]["mean"] == [r[key] for r in rows]
            assert len(latency["series"][key][mode]["seeds"]) == 4  # 2 loads x 2 seeds
    fig, goodput = sweep_page.goodput_figure(sweep)
    assert goodput["attainment"] == 0.9
    assert [line.get_gid() for line in fig.axes[1].lines if line.get_gid() == "threshold"] == ["threshold"]
    _, capacity = sweep_page.capacity_figure(sweep)
    assert capacity == sweep["capacity"]


def test_report_shows_the_stored_sweep_and_nothing_without_one(swept, tmp_path):
    where, sweep = swept
    traces = [runner.run_scenario(scenario.load("concurrency2"), "slice")]
    shown = report.build(tmp_path / "with", tmp_path / "no-storage", traces=traces, sweep_path=where / STORE)
    data = json.loads((tmp_path / "with" / "data.json").read_text())
    assert data["sweep"]["capacity"] == sweep["capacity"] and shown.sweep == sweep
    html = (tmp_path / "with" / "index.html").read_text()
    assert "id='sweep-section'" in html and "href=\"#sweep-section\"" in html
    for key in ("latency", "goodput", "capacity"):
        assert (tmp_path / "with" / shown.images[f"sweep:{key}"]).read_bytes()[:8] == PNG_SIGNATURE
    assert "## Latest sweep" in (tmp_path / "with" / "summary.md").read_text()

    bare = report.build(tmp_path / "without", tmp_path / "no-storage", traces=traces, sweep_path=tmp_path / "none")
    assert bare.sweep is None and "sweep-section" not in (tmp_path / "without" / "index.html").read_text()
    assert json.loads((tmp_path / "without" / "data.json").read_text())["sweep"] is None


def test_a_file_that_is_not_a_sweep_is_not_shown(tmp_path):
    (tmp_path / "x.json").write_text("[1, 2]")
    assert sweep_page.load(tmp_path / "x.json") is None and sweep_page.load(Path("/nonexistent")) is None
