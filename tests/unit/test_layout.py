"""The layout's promises, checked on the source: no import cycle, a pure core, one-way imports,
nothing under coopsched/ imports the harness, nothing imports the tests.

Every module of every top-level source folder is found from the tree (a new module or folder is
covered without a line here), and every import counts, those inside functions and under
TYPE_CHECKING too: a cycle worked around with a late import is still a cycle to a reader.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = "tests"
NOT_SOURCE = {TESTS, "build", "dist", "__pycache__"}  # and hidden folders, *.egg-info
IMPURE = {"time", "os", "threading", "asyncio", "random", "socket", "subprocess", "mlx", "mlx_lm", "numpy"}
# the one place coopsched names harness modules: `coopsched COMMAND` loads the command's module by name
NAME_LOADER = "coopsched.cli"
HARNESS_NAME = re.compile(r"harness(\.\w+)*")


def source_roots(root: Path = ROOT) -> list[str]:
    """Top-level folders holding Python source, the tests aside."""
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and p.name not in NOT_SOURCE and not p.name.startswith(".")
                  and not p.name.endswith(".egg-info") and next(p.rglob("*.py"), None) is not None)


def installed_roots(root: Path = ROOT) -> set[str]:
    """The folders the package installs (pyproject's `packages.find` include patterns)."""
    include = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    return {pattern.rstrip("*") for pattern in include}


def helper_names(root: Path = ROOT) -> set[str]:
    """What a module of the tests can be imported as: `tests...`, or its bare name (pytest puts
    each test folder on sys.path, so `factories`, `plants`, `mlx_helpers`...)."""
    return {TESTS} | {p.stem for p in (root / TESTS).rglob("*.py")}


@functools.cache  # read once per tree: the tests below only look
def modules(root: Path = ROOT) -> dict[str, set[str]]:
    """Every module of the source folders -> the names it imports (resolved, dotted)."""
    graph: dict[str, set[str]] = {}
    for package in source_roots(root):
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            graph[name] = imports(ast.parse(path.read_text()), list(parts[:-1]))
    return graph


def imports(tree: ast.AST, here: list[str]) -> set[str]:
    """The names a module imports; `here` is the package a relative import starts from."""
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            imported |= {target} | {f"{target}.{alias.name}" for alias in node.names}
    return imported


def harness_names(root: Path = ROOT) -> dict[str, set[str]]:
    """Module of coopsched -> the harness modules it names in a string (what importlib would load)."""
    named = {}
    for path in (root / "coopsched").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        strings = {node.value for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Constant) and isinstance(node.value, str)}
        named[name] = {s for s in strings if HARNESS_NAME.fullmatch(s)}
    return named


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


def test_twins_import_only_the_standard_library_the_core_and_themselves():
    """A server kind's model is a scheduler: as pure as the core (it reads no clock, env or model)."""
    stdlib = set(sys.stdlib_module_names)
    found = {m: i for m, i in modules().items() if m.startswith("coopsched.twins")}
    assert "coopsched.twins.base" in found
    for module, imported in found.items():
        tops = {name.split(".")[0] for name in imported if name}
        ours = {n for n in imported if n.startswith("coopsched.")
                and not n.startswith(("coopsched.core", "coopsched.twins"))}
        assert not {t for t in tops if t not in stdlib and t != "coopsched"} and not ours, (module, imported)
        assert not (tops & IMPURE), f"{module} imports {sorted(tops & IMPURE)}"


# -- the rules, each a function of the tree so a planted tree can show it fails -----------------
def imports_of_the_tests(root: Path = ROOT) -> dict[str, set[str]]:
    """Source module -> what it imports of the tests."""
    helpers = helper_names(root)
    found = {m: {n for n in imported if n.split(".")[0] in helpers} for m, imported in modules(root).items()}
    return {m: names for m, names in found.items() if names}


def imports_of_the_harness(root: Path = ROOT) -> dict[str, set[str]]:
    """coopsched module -> the harness modules it imports, or names for loading (the CLI's table aside)."""
    found = {m: {n for n in imported if n.split(".")[0] == "harness"}
             for m, imported in modules(root).items() if m.split(".")[0] == "coopsched"}
    for module, named in harness_names(root).items():
        if module != NAME_LOADER:
            found[module] = found.get(module, set()) | named
    return {m: names for m, names in found.items() if names}


def imports_of_uninstalled(root: Path = ROOT) -> dict[str, set[str]]:
    """Installed module -> the local folders it imports that are not installed (tools, scripts)."""
    installed, local = installed_roots(root), set(source_roots(root))
    found = {m: {n for n in imported if n.split(".")[0] in local - installed}
             for m, imported in modules(root).items() if m.split(".")[0] in installed}
    return {m: names for m, names in found.items() if names}


def test_every_source_folder_is_covered():
    """The folders found are the ones the package installs, plus any folder of scripts."""
    roots = source_roots()
    assert installed_roots() <= set(roots), roots
    assert TESTS not in roots and {"coopsched.backends.mlx_backend", "coopsched.cli", "coopsched.clock",
                                   "coopsched.env", "coopsched.executor", "coopsched.server.app"} <= set(modules())


def test_nothing_imports_the_tests():
    assert imports_of_the_tests() == {}


def test_nothing_under_coopsched_imports_the_harness():
    """The harness is built on coopsched, never the other way (`coopsched run` etc. load their
    harness module by name from coopsched/cli.py's command table, and nothing else may)."""
    assert imports_of_the_harness() == {}
    assert harness_names()[NAME_LOADER], "the CLI's command table no longer names harness modules"


def test_installed_packages_import_only_installed_packages():
    assert imports_of_uninstalled() == {}


def test_imports_point_one_way():
    """core <- backends, mocks <- engine, executor <- server, harness <- tools: nothing below imports what is
    above it; the verdict record imports nothing of ours, and harness's jobs do not import one another."""
    edges = internal_edges(modules())
    above = {"coopsched.core": ("coopsched.backends", "coopsched.engine", "coopsched.executor", "coopsched.server",
                                "mocks", "harness"),
             "mocks": ("coopsched.server", "coopsched.engine", "harness", "tools"),
             "coopsched.engine": ("coopsched.server",),
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


PLANTED = {  # a tree with one new module per rule, each breaking it
    "pyproject.toml": '[tool.setuptools.packages.find]\ninclude = ["coopsched*", "harness*", "mocks*"]\n',
    "coopsched/__init__.py": "",
    "coopsched/brand_new.py": "def late():\n    from harness.judge import rules\n",
    "coopsched/server/loader.py": "import importlib\nMODULE = importlib.import_module('harness.compare')\n",
    "coopsched/cli.py": "COMMANDS = {'run': 'harness.run.cli'}\n",
    "harness/__init__.py": "",
    "harness/verdict/check.py": "from tools import measure\n",
    "mocks/helper.py": "from factories import make_backend\n",
    "tools/measure.py": "import tests.plants\n",
    "tests/factories.py": "",
    "tests/plants.py": "",
}


def test_each_rule_fails_on_a_planted_import(tmp_path):
    for name, text in PLANTED.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert source_roots(tmp_path) == ["coopsched", "harness", "mocks", "tools"]
    assert imports_of_the_harness(tmp_path) == {"coopsched.brand_new": {"harness.judge", "harness.judge.rules"},
                                                "coopsched.server.loader": {"harness.compare"}}
    assert imports_of_the_tests(tmp_path) == {"mocks.helper": {"factories", "factories.make_backend"},
                                              "tools.measure": {"tests.plants"}}
    assert imports_of_uninstalled(tmp_path) == {"harness.verdict.check": {"tools", "tools.measure"}}
