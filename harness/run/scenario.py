"""Scenarios as data: TOML files in scenarios/, loaded into a Scenario record.

A scenario names its requests (arrival, prompt, budget, opt-out, acceptance
script), its scheduler and cost overrides, its own gate defaults (the
environment wins over them) and the checks that must hold in each mode.
"""

from __future__ import annotations

import random
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from coopsched.core import Priority, Request, SamplingParams

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"


@dataclass(frozen=True)
class RequestSpec:
    id: str
    arrival_ms: float = 0.0
    prompt_len: int = 16
    prompt: str | None = None
    max_tokens: int = 64
    speculative: bool = True
    priority: str = "normal"
    temperature: float = 0.0
    stop: tuple[str, ...] = ()
    accept_script: tuple[int, ...] = ()

    def prompt_tokens(self, seed: int) -> tuple[int, ...]:
        if self.prompt is not None:
            return tuple(self.prompt.encode("utf-8"))
        rng = random.Random(f"prompt:{seed}:{self.id}")
        return tuple(rng.randrange(32, 127) for _ in range(self.prompt_len))

    def build(self, seed: int, speculative: bool | None = None) -> Request:
        return Request(
            id=self.id, prompt_token_ids=self.prompt_tokens(seed), max_tokens=self.max_tokens,
            sampling=SamplingParams(self.temperature, seed if self.temperature > 0 else None),
            stop=self.stop, speculative=self.speculative if speculative is None else speculative,
            priority=Priority[self.priority.upper()], arrival_ms=self.arrival_ms)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    proves: str
    requests: tuple[RequestSpec, ...]
    scheduler: dict = field(default_factory=dict)
    cost: dict = field(default_factory=dict)
    mock: dict = field(default_factory=dict)
    gates: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> "Scenario":
        data = tomllib.loads(path.read_text())
        requests = tuple(RequestSpec(**{**r, "stop": tuple(r.get("stop", ())),
                                        "accept_script": tuple(r.get("accept_script", ()))})
                         for r in data.pop("requests"))
        return cls(requests=requests, **data)

    def build_requests(self, seed: int, speculative: bool | None = None) -> list[Request]:
        return [spec.build(seed, speculative) for spec in self.requests]


def available() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))


def load(name: str) -> Scenario:
    path = SCENARIO_DIR / f"{name}.toml"
    if not path.is_file():
        raise ValueError(f"unknown scenario {name!r}; available: {', '.join(available())}")
    return Scenario.load(path)
