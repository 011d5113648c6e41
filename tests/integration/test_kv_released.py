"""`kv_released` judges what the backend reports: a leaked cache fails it, and a backend that
reports no `num_live` (part of the ModelBackend protocol) is refused, never passed."""

from __future__ import annotations

import argparse

import pytest

from harness.run import cli as run_cli
from harness.run import runner, scenario
from mocks import MockBackend


class Unreporting:
    """A backend that makes every model call but does not say how many caches it holds."""

    def __init__(self, inner: MockBackend) -> None:
        self._inner, self.eos_token_id = inner, inner.eos_token_id

    def __getattr__(self, name: str):
        if name == "num_live":
            raise AttributeError(name)
        return getattr(self._inner, name)


def unreporting(clock, scen, seed):
    return Unreporting(runner.mock_backend(clock, scen, seed))


def kv_released(trace: dict) -> dict:
    return next(c for c in trace["checks"] if c["name"] == "kv_released")


def test_caches_freed_hold_and_a_planted_leak_fails(monkeypatch):
    scen = scenario.load("concurrency2")
    check = kv_released(runner.run_scenario(scen, "slice"))
    assert check["ok"] and check["value"] == 0
    monkeypatch.setattr(MockBackend, "release", lambda self, seq_id: None)  # every cache leaks
    check = kv_released(runner.run_scenario(scen, "slice"))
    assert not check["ok"] and check["value"] == len(scen.requests)


def test_a_backend_without_num_live_is_refused():
    with pytest.raises(ValueError, match="backend Unreporting reports no num_live"):
        runner.run_scenario(scenario.load("concurrency2"), "slice", backend_factory=unreporting)


def test_the_run_command_refuses_it_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(run_cli, "backend_factory", lambda args: unreporting)
    args = argparse.Namespace(names=["concurrency2"], mode="slice", json=None, seed=0, backend="mock",
                              model=None, draft_model=None, cost=None, target=None, hol_budget_ms=None)
    assert run_cli.main(args) == 2
    out = capsys.readouterr().out
    assert "error: backend Unreporting reports no num_live" in out and "Traceback" not in out
    assert "expectations hold" not in out
