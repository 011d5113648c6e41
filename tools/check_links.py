"""Every relative link in README.md and docs/ must reach a file, and an anchor a heading of it.

Links inside code are not links. Anchors are made from headings as the docs site makes
them (Python-Markdown's toc slugify), so the README's links work there and on a forge.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
EXPLICIT_ID = re.compile(r"\{\s*#([\w-]+)[^}]*\}\s*$")


def slugify(text: str) -> str:
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    found: set[str] = set()
    for heading in HEADING.findall(text):
        explicit = EXPLICIT_ID.search(heading)
        base = explicit.group(1) if explicit else slugify(re.sub(r"`|\*|_(?=\w)|(?<=\w)_", "", heading))
        slug, n = base, 1
        while slug in found:  # repeated headings get -1, -2, ... as the toc does
            slug, n = f"{base}_{n}", n + 1
        found.add(slug)
    return found


def broken_links(files: list[Path]) -> list[str]:
    """One line per link that does not resolve: FILE:LINE, the link, and why."""
    out = []
    for path in files:
        text = path.read_text()
        prose = CODE.sub("", FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text))
        for match in LINK.finditer(prose):
            target = match.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto:, ...
                continue
            line = prose.count("\n", 0, match.start()) + 1
            where = f"{path.relative_to(ROOT)}:{line}"
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                out.append(f"{where}: link {target!r}: {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}"
                           " does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                out.append(f"{where}: link {target!r}: {dest.name} has no heading with anchor #{anchor}")
    return out


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


if __name__ == "__main__":
    problems = broken_links(doc_files())
    print("\n".join(problems) or "every relative link resolves")
    sys.exit(1 if problems else 0)
