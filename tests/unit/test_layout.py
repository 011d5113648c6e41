"""The layout's promises, checked on the source: no import cycle, a pure core, one-way imports.

Every import counts, those inside functions and under TYPE_CHECKING too: a cycle
worked around with a late import is still a cycle to a reader.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("coopsched", "harness", "mocks", "tools")  # tools/: scripts that measure rather than test
IMPURE = {"time", "os", "threading", "asyncio", "random", "socket", "subprocess", "mlx", "mlx_lm", "numpy"}


def modules() -> dict[str, set[str]]:
    """Every module of the packages -> the names it imports (resolved, dotted)."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            here = list(parts[:-1])  # the package a relative import starts from
            imported = set()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    imported |= {alias.name for alias in node.names}
                elif isinstance(node, ast.ImportFrom):
                    base = here[: len(here) - node.level + 1] if node.level else []
                    target = ".".join(base + ([node.module] if node.module else []))
                    imported |= {target} | {f"{target}.{alias.name}" for alias in node.names}
            graph[name] = imported
    return graph


def internal_edges(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (a package's own __init__ is not an edge from inside it)."""
    return {m: {i for i in imps if i in graph and i != m and not m.startswith(i + ".")}
            for m, imps in graph.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_import_cycle_anywhere():
    assert find_cycle(internal_edges(modules())) is None


def test_the_cycle_finder_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(edges) == ["a", "b", "c", "a"]


def test_core_imports_only_the_standard_library_and_itself():
    stdlib = set(sys.stdlib_module_names)
    for module, imported in modules().items():
        if not module.startswith("coopsched.core"):
            continue
        tops = {name.split(".")[0] for name in imported if name}
        foreign = {t for t in tops if t not in stdlib and t != "coopsched"}
        ours = {n for n in imported if n.startswith("coopsched.") and not n.startswith("coopsched.core")}
        assert not foreign and not ours, f"{module} imports {sorted(foreign | ours)}"
        assert not (tops & IMPURE), f"{module} imports {sorted(tops & IMPURE)}: the core reads no clock, env or model"


@pytest.mark.parametrize("package", PACKAGES)
def test_nothing_imports_the_tests(package):
    for module, imported in modules().items():
        if module.startswith(package):
            assert not {n for n in imported if n.split(".")[0] in ("tests", "factories", "plants")}, module


def test_imports_point_one_way():
    """core <- backends, mocks <- engine, executor <- server, harness <- tools: nothing below imports what is
    above it; the verdict record imports nothing of ours, and harness's jobs do not import one another."""
    edges = internal_edges(modules())
    above = {"coopsched.core": ("coopsched.backends", "coopsched.engine", "coopsched.executor", "coopsched.server",
                                "mocks", "harness"),
             "mocks": ("coopsched.server", "coopsched.engine", "harness", "tools"),
             "coopsched.engine": ("coopsched.server", "harness"),
             "coopsched.server": ("harness",),
             # the check record stands alone; the jobs that make checks do not import one another
             "harness.verdict.check": ("coopsched", "harness", "mocks"),
             "harness.verdict": ("harness.judge", "harness.report", "harness.sweep"),
             "harness.run": ("harness.judge", "harness.report", "harness.sweep"),
             "harness.live": ("harness.judge", "harness.report", "harness.sweep"),
             "harness.judge": ("harness.report", "harness.sweep", "harness.live"),
             # measuring scripts use the package; nothing in it uses them
             "coopsched": ("tools",), "harness": ("tools",)}
    for module, targets in edges.items():
        for low, highs in above.items():
            if module == low or module.startswith(low + "."):
                wrong = {t for t in targets if t.startswith(highs)}
                assert not wrong, f"{module} imports {sorted(wrong)}"
