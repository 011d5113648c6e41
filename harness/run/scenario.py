"""Scenarios as data: TOML files in scenarios/ (or any path), loaded into a Scenario record.

A scenario names its requests (arrival, prompt, budget, opt-out, acceptance
script) and/or a `[workload]` that generates them per seed (harness/run/workload.py),
its scheduler and cost overrides, its own gate defaults (the environment wins over
them) and the checks that must hold in each mode.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from coopsched.core import Request, SchedulerConfig
from harness.run.workload import RequestSpec, Workload, WorkloadError, read_text
from mocks import CostModel

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"
TABLES = ("scheduler", "cost", "mock", "gates", "checks")
MOCK_KEYS = ("accept_prob", "eos_rate")
CHECK_NAMES = ("classic_itl", "prefill_stall", "prefill_grant", "mixed_step",  # harness/verdict/virtual.py
               "burst_wall", "lump", "rotation", "window", "throughput_vs_burst",
               "parity", "vs_burst")  # reference runs, on unless `= false`


class ScenarioError(ValueError):
    """A scenario that cannot be found or loaded; the message says which file, which value, what is accepted."""


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str = ""
    proves: str = ""
    requests: tuple[RequestSpec, ...] = ()  # the explicit [[requests]]
    scheduler: dict = field(default_factory=dict)
    cost: dict = field(default_factory=dict)
    mock: dict = field(default_factory=dict)
    gates: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)
    workload: Workload | None = None
    server: dict = field(default_factory=dict)  # the twin's server: {"kind": KIND, **params} (a profile's)

    @classmethod
    def load(cls, path: Path) -> Scenario:
        """Named after the file's stem; errors name the file and the value."""
        data = _read_toml(path)
        unknown = sorted(set(data) - {"name", "description", "proves", "requests", "workload", *TABLES})
        if unknown:
            raise ScenarioError(f"{path}: unknown key {', '.join(map(repr, unknown))}; accepted: name, description, "
                                f"proves, [[requests]], [workload], {', '.join(f'[{t}]' for t in TABLES)}")
        if data.pop("name", path.stem) != path.stem:
            raise ScenarioError(f"{path}: a scenario is named after its file ({path.stem!r}); "
                                "drop `name` or rename the file")
        for key in ("description", "proves"):
            if not isinstance(data.get(key, ""), str):
                raise ScenarioError(f"{path}: {key} must be text")
        for table in TABLES:
            _check_table(path, table, data.get(table, {}))
        requests = _request_specs(path, data.pop("requests", []))
        try:
            workload = Workload.parse(data.pop("workload"), path.parent) if "workload" in data else None
        except WorkloadError as exc:  # say which scenario file: a run may name several
            raise WorkloadError(f"{path}: {exc}") from None
        if not requests and workload is None:
            raise ScenarioError(f"{path}: no [[requests]] and no [workload]; give at least one")
        mock = dict(data.pop("mock", {}))
        if workload is not None and workload.accept_prob is not None:
            if "accept_prob" in mock:  # two places for one number: refuse rather than pick one silently
                raise ScenarioError(f"{path}: accept_prob is set in both [workload] and [mock]; keep one")
            mock["accept_prob"] = workload.accept_prob
        clash = sorted({r.id for r in requests} & set(workload.ids() if workload else ()))
        if clash:
            raise ScenarioError(f"{path}: request id {clash[0]!r} is also a generated one "
                                f"([workload] names its requests w0000, w0001, ...); rename it")
        return cls(name=path.stem, requests=requests, workload=workload, mock=mock, **data)

    def specs(self, seed: int) -> tuple[RequestSpec, ...]:
        """The explicit requests, then the workload's for this seed."""
        return self.requests + (_generated(self.workload, seed) if self.workload else ())

    def runs_reference(self, name: str) -> bool:
        """Whether a reference run is wanted: `parity` (speculation forced off) or `vs_burst`
        (the legacy burst, for ratios): on unless the scenario's [checks] set it to false."""
        return self.checks.get(name, True) is not False

    def build_requests(self, seed: int, speculative: bool | None = None) -> list[Request]:
        return [spec.build(seed, speculative) for spec in self.specs(seed)]

    def arrivals(self, requests: list[Request]):
        """What the engine runs: the requests, or a closed loop over the workload's."""
        return self.workload.arrivals(requests) if self.workload else requests

    def for_seed(self, seed: int) -> Scenario:
        """This scenario with its workload's requests written out (for a runner that takes a fixed list)."""
        if self.workload is None:
            return self
        if self.workload.is_closed:
            raise ScenarioError(f"scenario {self.name!r}: a closed-loop workload runs in virtual time only "
                                "(a fixed list of arrivals is all --target can send)")
        return replace(self, requests=self.specs(seed), workload=None)


@functools.lru_cache(maxsize=8)  # a scenario x mode runs it three times (run, parity, burst)
def _generated(workload: Workload, seed: int) -> tuple[RequestSpec, ...]:
    return tuple(workload.specs(seed))


def _read_toml(path: Path) -> dict:
    text = read_text(path, "scenario file", ScenarioError)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML ({exc})") from None


def _check_table(path: Path, name: str, table) -> None:
    if not isinstance(table, dict):
        raise ScenarioError(f"{path}: {name} must be a table ([{name}])")
    accepted = {"scheduler": [f.name for f in fields(SchedulerConfig)],
                "cost": [f.name for f in fields(CostModel) if f.name != "seed"],
                "mock": list(MOCK_KEYS), "checks": list(CHECK_NAMES)}.get(name)
    unknown = sorted(set(table) - set(accepted)) if accepted is not None else []
    if unknown:
        raise ScenarioError(f"{path}: [{name}] unknown key {', '.join(map(repr, unknown))}; "
                            f"accepted: {', '.join(accepted)}")


def _request_specs(path: Path, tables) -> tuple[RequestSpec, ...]:
    accepted = [f.name for f in fields(RequestSpec)]
    if not isinstance(tables, list):
        raise ScenarioError(f"{path}: requests must be an array of tables ([[requests]])")
    specs = []
    for number, table in enumerate(tables, 1):
        unknown = sorted(set(table) - set(accepted)) if isinstance(table, dict) else []
        if not isinstance(table, dict) or "id" not in table or unknown:
            what = f"unknown key {', '.join(map(repr, unknown))}" if unknown else "no id"
            raise ScenarioError(f"{path}: [[requests]] #{number}: {what}; accepted: {', '.join(accepted)}")
        specs.append(RequestSpec(**{**table, "stop": tuple(table.get("stop", ())),
                                    "accept_script": tuple(table.get("accept_script", ()))}))
    ids = [s.id for s in specs]
    if len(set(ids)) != len(ids):
        raise ScenarioError(f"{path}: request id {next(i for i in ids if ids.count(i) > 1)!r} appears twice")
    return tuple(specs)


def available() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def resolve(name: str) -> Path:
    """A NAME: a path to an existing file (or anything ending in .toml, relative to the working
    directory), else a shipped scenario."""
    path = Path(name)
    if path.is_file() or name.endswith(".toml"):
        return path
    shipped = SCENARIO_DIR / f"{name}.toml"
    if shipped.is_file():
        return shipped
    raise ScenarioError(f"unknown scenario {name!r}: not a file and not one of {', '.join(available())} "
                        "(a path to a scenario .toml file also works)")


def load(name: str) -> Scenario:
    return Scenario.load(resolve(name))
