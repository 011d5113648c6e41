"""`coopsched sweep --out DIR` (page, PNGs, the plotted data) and the latest sweep in `coopsched report`
(the sweep and the reports are built once a session: tests/bench/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.report import sweep_page
from harness.sweep.cli import STORE

pytestmark = pytest.mark.bench
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


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


def test_report_shows_the_stored_sweep_and_nothing_without_one(swept, built, bare):
    """`built` is `coopsched report --sweep` on the stored sweep; `bare` a report given no sweep."""
    where, sweep = swept
    assert sweep_page.load(where / STORE) == sweep  # what the report reads is the sweep as stored
    _, out, data = built
    assert data["sweep"] == {"path": str(where / STORE), "scenario": sweep["scenario"], "capacity": sweep["capacity"]}
    assert data["plotted"]["sweep:capacity"] == sweep["capacity"]
    html = (out / "index.html").read_text()
    assert "id='sweep-section'" in html and "href=\"#sweep-section\"" in html
    for key in ("latency", "goodput", "capacity"):
        assert (out / data["images"][f"sweep:{key}"]).read_bytes()[:8] == PNG_SIGNATURE
    assert "## Latest sweep" in (out / "summary.md").read_text()

    shown, out = bare
    assert shown.sweep is None and "sweep-section" not in (out / "index.html").read_text()
    assert "## Latest sweep" not in (out / "summary.md").read_text()
    assert json.loads((out / "data.json").read_text())["sweep"] is None


def test_a_file_that_is_not_a_sweep_is_not_shown(tmp_path):
    (tmp_path / "x.json").write_text("[1, 2]")
    assert sweep_page.load(tmp_path / "x.json") is None and sweep_page.load(Path("/nonexistent")) is None
