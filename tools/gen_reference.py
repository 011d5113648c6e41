"""Write docs/reference/*.md from the program itself, or check them with --check.

Names come from the code: the argparse parsers, coopsched/env.py's gate table, the
/metrics of an in-process server, and JSON the commands really write. What the code
does not say (a metric's unit, a JSON key's meaning) is in tools/reference_meanings.toml.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
MEANINGS = Path(__file__).with_name("reference_meanings.toml")
REGENERATE = "python tools/gen_reference.py"
PLACEHOLDER = "UNDOCUMENTED"
# raw values every gate is parsed with for its table (the golden gate file's set, and the empty string)
RAW_VALUES = (None, "", "1", "0", "true", "false", "True", "False", "TRUE", "FALSE", "yes", "no", "on",
              "off", "OFF", " 0", " 12 ", "\t3\n", "+8", "-3", "2", "8.5", "eight", "1_0", "１２", "auto",
              "mtp", "dflash", "DFLASH")
GATE_PATTERN = re.compile(r"\b(?:MLXCEL|COOPSCHED)_[A-Z0-9_]+\b")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# -- what the program has -------------------------------------------------------------
@dataclass
class Arg:
    name: str            # `--json`, or a positional's metavar (`NAME`)
    metavar: str
    default: str
    help: str


@dataclass
class Command:
    path: str            # "coopsched run", "coopsched model build"
    help: str
    usage: str
    args: list[Arg] = field(default_factory=list)


def collect_cli() -> list[Command]:
    """Every subcommand (nested ones too) and every argument, from the parsers `coopsched` builds."""
    from coopsched.cli import COMMANDS, build_parser

    commands: list[Command] = []
    for name, (_, help_text) in COMMANDS.items():
        top = build_parser([name])
        _walk_parser(_subparsers(top).choices[name], f"coopsched {name}", help_text, commands)
    return commands


def _subparsers(parser: argparse.ArgumentParser):
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _walk_parser(parser: argparse.ArgumentParser, path: str, help_text: str, out: list[Command]) -> None:
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=100)
    formatter = parser._get_formatter()
    command = Command(path, help_text, parser.format_usage().strip())
    out.append(command)
    sub = _subparsers(parser)
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action is sub:
            continue
        # a `|` in a table's code span shows as `\|`: a positional NAME|PATH is listed as "NAME or PATH"
        name = action.option_strings[-1] if action.option_strings else (action.metavar or action.dest).replace(
            "|", " or ")
        metavar = "" if action.nargs == 0 or not action.option_strings else (action.metavar or action.dest.upper())
        if action.choices and not action.metavar and action.option_strings:
            metavar = "|".join(map(str, action.choices))
        names = ", ".join(action.option_strings[:-1])
        help_line = formatter._expand_help(action) if action.help else ""
        help_line = f"{help_line} (also {names})" if names else help_line
        command.args.append(Arg(name, metavar, _default(action), help_line))
    if sub is not None:
        helps = {a.dest: a.help or "" for a in sub._choices_actions}
        for child, child_parser in sub.choices.items():
            _walk_parser(child_parser, f"{path} {child}", helps.get(child, ""), out)


def _default(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "off" if action.default in (False, None) else "on"
    if action.default is None or action.default == argparse.SUPPRESS or action.default == []:
        return "-"
    text = str(action.default)  # a path inside the checkout reads the same in every clone
    return text.replace(f"{ROOT}/", "") if text.startswith(f"{ROOT}/") else text


@dataclass
class GateDoc:
    name: str
    default: str
    meaning: str
    outcomes: list[tuple[str, list[str]]]   # (what it parses to, the raw values that give it)


def collect_gates() -> tuple[list[GateDoc], set[str]]:
    """Each gate of env.py's table with its parse table; and every gate-like name the source mentions."""
    from coopsched import env

    docs = [GateDoc(g.name, g.default, g.meaning, _outcomes(env, g.name)) for g in (*env.GATES, *env.KNOBS)]
    mentioned: set[str] = set()
    for package in ("coopsched", "harness", "mocks", "scenarios"):
        for path in (ROOT / package).rglob("*.py"):
            mentioned |= set(GATE_PATTERN.findall(path.read_text()))
    return docs, mentioned


def _outcomes(env, name: str) -> list[tuple[str, list[str]]]:
    """Group RAW_VALUES by what `Gates.parse({name: raw})` makes of them, in first-seen order."""
    base = env.Gates.parse({})
    fields = [f.name for f in dataclasses.fields(env.Gates) if f.name != "warnings"]
    parsed: list[tuple[str | None, object]] = []
    touched: set[str] = set()
    for raw in RAW_VALUES:
        try:
            gates = env.Gates.parse({} if raw is None else {name: raw})
        except env.GateError:
            parsed.append((raw, "startup error"))
            continue
        touched |= {f for f in fields if getattr(gates, f) != getattr(base, f)}
        parsed.append((raw, gates))
    groups: dict[str, list[str]] = {}
    for raw, gates in parsed:
        if isinstance(gates, str):
            outcome = gates
        else:
            outcome = ", ".join(f"`{f} = {json.dumps(getattr(gates, f))}`" for f in sorted(touched)) or "no effect"
            if gates.warnings:
                outcome += " (with a warning)"
        shown = "unset" if raw is None else f"`{json.dumps(raw, ensure_ascii=False)}`"
        groups.setdefault(outcome, []).append(shown)
    return list(groups.items())


@dataclass
class Family:
    name: str      # as a query names it: a counter's `_total` included
    type: str
    labels: list[str]
    help: str


def collect_metrics() -> list[Family]:
    """The families a live /metrics of an in-process `coopsched serve` app exposes (after one request)."""
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from coopsched.server.app import create_app
    from coopsched.server.cli import add_arguments, build_host

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    host = build_host(parser.parse_args(["--decode-ms", "0.1", "--round-ms", "0.5",
                                         "--prefill-ms-per-token", "0"]))
    with TestClient(create_app(host)) as client:
        reply = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4})
        reply.raise_for_status()
        text = client.get("/metrics").text
    families = []
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):  # prometheus_client's creation timestamp of another family
            continue
        labels = sorted({k for s in family.samples for k in s.labels} - {"le", "quantile"})
        name = f"{family.name}_total" if family.type == "counter" else family.name
        families.append(Family(name, family.type, labels, family.documentation))
    return families


# -- JSON outputs ---------------------------------------------------------------------
SWEEP_WORKLOAD = """[workload]
num_requests = 12
arrival = "poisson"
rate_per_s = 4
prompt_len = { min = 8, max = 32 }
max_tokens = { mean = 16, sigma = 0.5 }
speculative_share = 0.5
"""


def collect_outputs(workdir: Path) -> dict[str, list]:
    """Real JSON from the commands: a trace of every scenario x mode, a small sweep, a locust report.

    The three run at once (each a child process) to keep the wait short. A profile is
    the cost model's fields plus what the shipped, calibrated profiles carry.
    """
    from mocks.cost import CostModel

    env = {k: v for k, v in os.environ.items() if not GATE_PATTERN.fullmatch(k)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    (workdir / "sweep.toml").write_text(SWEEP_WORKLOAD)
    cli = [sys.executable, "-m", "coopsched.cli"]
    jobs = {
        "trace": [*cli, "run", "--mode", "all", "--json", "trace.json"],
        "sweep": [*cli, "sweep", "sweep.toml", "--rates", "2,4", "--seeds", "1", "--json", "sweep.json"],
        "locust": [sys.executable, "-m", "locust", "-f", str(ROOT / "scenarios" / "concurrency2.py"), "--headless",
                   "-u", "2", "-r", "2", "-t", "3s", "--only-summary", "--report-json", "locust.json"],
    }
    procs = {k: subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True) for k, cmd in jobs.items()}
    outputs: dict[str, list] = {}
    for key, proc in procs.items():
        log, _ = proc.communicate(timeout=300)
        path = workdir / f"{key}.json"
        if not path.exists():
            raise RuntimeError(f"{' '.join(jobs[key])} wrote no {path.name} (exit {proc.returncode}):\n{log[-2000:]}")
        doc = json.loads(path.read_text())
        outputs[key] = doc if isinstance(doc, list) else [doc]
    outputs["report"] = [calibration_report()]
    profiles = [json.loads(p.read_text()) for p in sorted((ROOT / "scenarios" / "profiles").glob("*.json"))]
    fields = {f.name: None for f in dataclasses.fields(CostModel)}
    outputs["profile"] = [fields, *profiles]
    return outputs


def calibration_report() -> dict:
    """A `calibrate --target --report` document from the functions the command builds it with, in
    virtual time: the twin's own mock stands in for the live server (no server to start)."""
    from harness.calibrate import books, heldout, twin
    from harness.calibrate import cli as calibrate
    from harness.run.runner import Profile
    from mocks.cost import CostModel

    profile, config = Profile(CostModel(accept_prob=0.7)), twin.twin_config("slice")
    runs = twin.simulate(profile, config, range(2))
    meta = calibrate.report_meta("http://127.0.0.1:8000", Path("profile.json"), [0.0], True, "coopsched",
                                 "/health reports mode='slice' and block_size")
    report = twin.build_report({"slice": runs}, {"slice": runs}, 2, meta)
    kept: dict = {}  # the step books of llama-server's report, here the twin's own counts on both sides
    on_twin = lambda scen, draw=0: twin.simulate_timed(profile, config, scen, heldout.SEED, draw=draw,
                                                       on_run=lambda run: kept.update(live=books.twin_books(run)))
    report["heldout"] = heldout.check(lambda scen, _run, _give_up: on_twin(scen), on_twin,
                                      heldout.solo_life_ms(profile.cost), num_requests=8,
                                      books=lambda side: kept.get("live"))
    return report


def key_paths(docs: list, documented: dict[str, str]) -> list[str]:
    """Every key path of some JSON objects: `requests[].token_ids`; a documented `P.*` makes P's keys data."""
    seen: dict[str, None] = {}

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, list):
            for item in node:
                walk(item, f"{prefix}[]")
        elif isinstance(node, dict):
            as_data = f"{prefix}.*" in documented
            for key, value in node.items():
                path = f"{prefix}.*" if as_data else (f"{prefix}.{key}" if prefix else key)
                if f"{path}.**" in documented:  # `P.**`: P and all under it, free-form, in one line
                    seen[f"{path}.**"] = None
                else:
                    seen[path] = None
                    walk(value, path)

    for doc in docs:
        walk(doc, "")
    return list(seen)


# sections of trace-json.md: (key in the meanings file and outputs, heading, what makes it)
JSON_SECTIONS = (
    ("trace", "Trace JSON", "`coopsched run --json PATH` (a list: one object per scenario x mode run)"),
    ("sweep", "Sweep JSON", "`coopsched sweep --json PATH` (also `DIR/sweep.json` with `--out DIR`)"),
    ("profile", "Profile JSON", "`coopsched calibrate --out PROFILE.json`, read by `--cost PROFILE.json`"),
    ("report", "Calibration report", "`coopsched calibrate ... --report PATH.json`"),
    ("locust", "Locust report", "`locust -f scenarios/concurrency2.py --report-json PATH`"),
)


@dataclass
class Facts:
    commands: list[Command]
    gates: list[GateDoc]
    gate_mentions: set[str]
    metrics: list[Family]
    keys: dict[str, list[str]]       # JSON section -> every key path a real output has
    outputs: dict[str, list] = field(default_factory=dict, repr=False)  # those outputs


def collect(workdir: Path | None = None) -> Facts:
    meanings = load_meanings()
    with tempfile.TemporaryDirectory(prefix="coopsched-reference-") as tmp:
        outputs = collect_outputs(Path(workdir or tmp))
    keys = {s: key_paths(outputs[s], meanings[s]) for s, _, _ in JSON_SECTIONS}
    gates, mentions = collect_gates()
    return Facts(collect_cli(), gates, mentions, collect_metrics(), keys, outputs)


def load_meanings() -> dict[str, dict]:
    return tomllib.loads(MEANINGS.read_text())


# -- the pages ------------------------------------------------------------------------
def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace("\n", " ")


def header(title: str, intro: str) -> list[str]:
    return [f"# {title}", "", f"<!-- generated by `{REGENERATE}`: edit the code or "
            "tools/reference_meanings.toml, then regenerate -->", "", intro, ""]


def render_cli(commands: list[Command]) -> str:
    lines = header("Command line", "Every `coopsched` subcommand and every argument, read from its argparse "
                   "parser. Task pages explain when to use which; this page is the list.")
    lines += [f"- [`{c.path}`](#{anchor(c.path)}): {cell(c.help)}" for c in commands]
    for command in commands:
        lines += ["", f"## {command.path}", "", cell(command.help), "", "```text", command.usage, "```", ""]
        if command.args:
            lines += ["| argument | value | default | meaning |", "|---|---|---|---|"]
            lines += [f"| `{cell(a.name)}` | {', '.join(f'`{cell(v)}`' for v in a.metavar.split('|') if v)} | "
                      f"{cell(a.default)} | "
                      f"{cell(a.help)} |" for a in command.args]
    return "\n".join(lines) + "\n"


def anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9_\- ]", "", title.lower()).strip().replace(" ", "-")


def render_gates(gates: list[GateDoc]) -> str:
    lines = header("Environment gates", "Every gate `coopsched/env.py` reads, with what each raw value parses "
                   "to (`Gates.parse`, run on the values below when this page was generated). A gate set in "
                   "the environment wins over a scenario's default; a command-line flag (`--mode`, "
                   "`--hol-budget-ms`) wins over the gate. \"off-set\" is exactly `0`, `false`, `FALSE`, "
                   "`no`, `off`.")
    lines += ["| gate | default | rule |", "|---|---|---|"]
    lines += [f"| `{g.name}` | {cell(g.default)} | {cell(g.meaning)} |" for g in gates]
    for gate in gates:
        lines += ["", f"## {gate.name}", "", "| parses to | raw values |", "|---|---|"]
        lines += [f"| {cell(outcome)} | {', '.join(cell(v) for v in raws)} |" for outcome, raws in gate.outcomes]
    return "\n".join(lines) + "\n"


def render_metrics(families: list[Family], meanings: dict) -> str:
    lines = header("Metrics", "Every metric family `GET /metrics` exposes (Prometheus text), read from a live "
                   "in-process server. Histograms also expose `_bucket`, `_sum` and `_count`, and counters and "
                   "histograms a `_created` timestamp (prometheus_client's); latency buckets "
                   "start at 1 ms.")
    lines += ["| metric | type | labels | unit | meaning |", "|---|---|---|---|---|"]
    for f in families:
        known = meanings.get(f.name, {})
        labels = ", ".join(f"`{label}`" for label in f.labels) or "-"
        lines.append(f"| `{f.name}` | {f.type} | {labels} | {cell(known.get('unit', PLACEHOLDER))} | "
                     f"{cell(known.get('meaning', f'{PLACEHOLDER} ({f.help})'))} |")
    return "\n".join(lines) + "\n"


def render_json(keys: dict[str, list[str]], meanings: dict[str, dict]) -> str:
    lines = header("JSON outputs", "Every key of the JSON files coopsched writes, read from real outputs when "
                   "this page was generated (`[]`: each item of a list; `*`: a map whose keys are data, such "
                   "as modes or kinds; `P.**`: P and everything under it, free-form). Keys that only some runs write "
                   "say when.")
    for section, title, made_by in JSON_SECTIONS:
        documented = meanings[section]
        rows = list(documented) + [k for k in keys[section] if k not in documented]
        lines += ["", f"## {title}", "", f"Written by {made_by}.", "", "| key | meaning |", "|---|---|"]
        lines += [f"| `{k}` | {cell(documented.get(k, PLACEHOLDER))} |" for k in rows]
    return "\n".join(lines) + "\n"


def render(facts: Facts) -> dict[str, str]:
    meanings = load_meanings()
    return {"cli.md": render_cli(facts.commands), "env-gates.md": render_gates(facts.gates),
            "metrics.md": render_metrics(facts.metrics, meanings["metrics"]),
            "trace-json.md": render_json(facts.keys, meanings)}


# -- the check ------------------------------------------------------------------------
def rows_by_section(page: str) -> dict[str, set[str]]:
    """Heading -> the first cells of its table rows (backticks stripped); "" holds rows before any heading."""
    sections: dict[str, set[str]] = {"": set()}
    current = ""
    for line in page.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections.setdefault(current, set())
        elif line.startswith("| `"):
            first = re.split(r"(?<!\\)\|", line)[1].strip().strip("`")
            sections[current].add(first.replace("\\|", "|").replace("&lt;", "<"))
    return sections


def problems(facts: Facts, pages: dict[str, str]) -> list[str]:
    """One line per name the program has that its reference page lacks (or lacks a meaning for)."""
    out: list[str] = []
    fix = f"run `{REGENERATE}`"
    meanings = load_meanings()
    cli = rows_by_section(pages.get("cli.md", ""))
    for command in facts.commands:
        if command.path not in cli:
            out.append(f"docs/reference/cli.md has no section for `{command.path}`: {fix}")
            continue
        out += [f"docs/reference/cli.md has no line for `{a.name}` of `{command.path}`: {fix}"
                for a in command.args if a.name not in cli[command.path]]
    gates = rows_by_section(pages.get("env-gates.md", ""))
    listed = {g.name for g in facts.gates}
    for name in sorted(listed | facts.gate_mentions):
        if name not in listed:
            out.append(f"{name} is read in the source but is not in coopsched/env.py's GATES or KNOBS table: "
                       "add it there (the reference is generated from that table)")
        elif name not in gates[""] or name not in gates:
            out.append(f"docs/reference/env-gates.md has no line (or no parse table) for {name}: {fix}")
    metric_rows = rows_by_section(pages.get("metrics.md", ""))[""]
    for family in facts.metrics:
        if family.name not in metric_rows:
            out.append(f"docs/reference/metrics.md has no line for `{family.name}`: {fix}")
        if family.name not in meanings["metrics"]:
            out.append(f"tools/reference_meanings.toml has no unit and meaning for metric `{family.name}`: add "
                       f'[metrics."{family.name}"] with unit and meaning, then {fix}')
    json_rows = rows_by_section(pages.get("trace-json.md", ""))
    for section, title, _ in JSON_SECTIONS:
        for key in facts.keys[section]:
            if key not in json_rows.get(title, set()):
                out.append(f"docs/reference/trace-json.md has no line for `{key}` under \"{title}\": {fix}")
            if key not in meanings[section]:
                out.append(f"tools/reference_meanings.toml has no meaning for {section} key `{key}`: add "
                           f'"{key}" = "..." under [{section}], then {fix}')
    return out


def read_pages() -> dict[str, str]:
    return {p.name: p.read_text() for p in REFERENCE.glob("*.md")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page lacks a name")
    args = parser.parse_args(argv)
    facts = collect()
    if args.check:
        found = problems(facts, read_pages())
        stale = [n for n, text in render(facts).items() if read_pages().get(n) != text]
        found += [f"docs/reference/{n} differs from what the code gives: run `{REGENERATE}`" for n in stale]
        print("\n".join(found) or "docs/reference: every name has its line")
        return 1 if found else 0
    REFERENCE.mkdir(parents=True, exist_ok=True)
    for name, text in render(facts).items():
        (REFERENCE / name).write_text(text)
    left = problems(facts, read_pages())
    print("\n".join(left) or f"wrote {', '.join(sorted(render(facts)))} under {REFERENCE.relative_to(ROOT)}")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
