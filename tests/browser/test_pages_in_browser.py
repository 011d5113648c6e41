"""The HTML report and the sweep page, opened in headless Chromium: every image loads, no console error.

Playwright drives the system's Chromium (Debian's package; `tox -e bench` installs it),
with the flags that keep it off the network. A page with a missing image, or one that
logs an error, is planted to show the check fails on each.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from factories import mixed_workload

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
IMAGES = """() => Array.from(document.images).map(i => ({src: i.getAttribute('src'),
                                                   ok: i.complete && i.naturalWidth > 0}))"""


@pytest.fixture(scope="module")
def browser():
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install -y chromium; tox -e bench installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (tox -e bench has it)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


def page_problems(browser, page_path: Path) -> tuple[int, list[str]]:
    """(images on the page, one line per image that did not load or console error / page error / failed fetch)."""
    page = browser.new_page()
    found: list[str] = []
    page.on("console", lambda m: found.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: found.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: found.append(f"failed to load {r.url}: {r.failure}"))
    try:
        page.goto(page_path.resolve().as_uri(), wait_until="load")
        images = page.evaluate(IMAGES)
    finally:
        page.close()
    found += [f"image {i['src']} did not load" for i in images if not i["ok"]]
    return len(images), found


def coopsched(*args: str, cwd: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "coopsched.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.fixture(scope="module")
def sweep_page(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("sweep")
    (work / "tiny.toml").write_text(mixed_workload(12))
    coopsched("sweep", "tiny.toml", "--rates", "2,4", "--seeds", "1", "--out", "page", cwd=work)
    return work / "page"


@pytest.fixture(scope="module")
def report_page(request, tmp_path_factory, sweep_page) -> Path:
    given = request.config.getoption("--report-dir")
    if given:
        return Path(given) / "index.html"
    work = tmp_path_factory.mktemp("report")
    coopsched("report", "--out", "latest", "--storage", "none-stored", "--sweep", str(sweep_page / "sweep.json"),
              cwd=work)
    return work / "latest" / "index.html"


def test_the_report_loads_every_image_without_a_console_error(browser, report_page):
    count, problems = page_problems(browser, report_page)
    assert not problems, "\n".join(problems)
    assert count >= 3, f"{report_page}: only {count} images"  # timeline, CDF and trends at least


def test_the_sweep_page_loads_every_image_without_a_console_error(browser, sweep_page):
    count, problems = page_problems(browser, sweep_page / "index.html")
    assert (count, problems) == (3, [])


def test_a_missing_image_fails_the_check(browser, sweep_page, tmp_path):
    planted = shutil.copytree(sweep_page, tmp_path / "planted")
    (planted / "sweep_capacity.png").unlink()
    _, problems = page_problems(browser, planted / "index.html")
    assert any("sweep_capacity.png" in line and "did not load" in line for line in problems), problems


def test_a_console_error_fails_the_check(browser, sweep_page, tmp_path):
    planted = shutil.copytree(sweep_page, tmp_path / "planted")
    page = planted / "index.html"
    page.write_text(page.read_text().replace("</body>", "<script>console.error('planted')</script></body>"))
    _, problems = page_problems(browser, page)
    assert problems == ["console error: planted"]
