"""Every relative link in README.md and docs/ reaches a file (and a heading, for an anchor)."""

from __future__ import annotations

import check_links


def test_every_relative_link_resolves():
    problems = check_links.broken_links(check_links.doc_files())
    assert not problems, "\n".join(problems)


def test_a_planted_broken_link_and_anchor_are_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(check_links, "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Reading the table\n")
    (tmp_path / "README.md").write_text(
        "# x\n\n[ok](docs/a.md#reading-the-table) [gone](docs/missing.md)\n"
        "[no anchor](docs/a.md#nowhere) `[in code](docs/nope.md)` [web](https://example.org)\n"
        "```\n[fenced](docs/nope.md)\n```\n[here](#x)\n")
    assert check_links.broken_links(check_links.doc_files(tmp_path)) == [
        "README.md:3: link 'docs/missing.md': docs/missing.md does not exist",
        "README.md:4: link 'docs/a.md#nowhere': a.md has no heading with anchor #nowhere"]


def test_the_readme_is_a_front_page_that_opens_with_its_two_commands():
    lines = (check_links.ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move detail into docs/"
    assert lines[2:5] == ["```sh",
                          "pip install -e '.[all]' && coopsched run     # the main job: every scenario, every mode, "
                          "on the embedded mock",
                          "pip install tox && tox                       # the tests (what CI runs)"]
