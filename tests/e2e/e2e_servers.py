"""What the e2e tests add to the live client (harness/live/client.py): a gate-free environment.

Servers are spawned by `harness.live.client.spawn_server` (free loopback port, /health,
SIGTERM on exit); `serve` only gives them an environment without the caller's MLXCEL_*
gates, so a developer's shell cannot change what a test sees.
"""

from __future__ import annotations

import os
import time

from harness.live.client import spawn_server, wait_healthy  # noqa: F401 - re-exported for the tests

GATE_PREFIX = "MLXCEL_"


def clean_env(**gates: str) -> dict:
    """The environment without any MLXCEL_* gate of the caller's, plus `gates`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(GATE_PREFIX)}
    env.update(gates)
    return env


def serve(*args: str, env: dict | None = None, command: list[str] | None = None, port: int | None = None):
    """`coopsched serve --port 0 ARGS` (or `command`) in a gate-free environment, as a context manager."""
    return spawn_server(args, command=command, port=port, env=env if env is not None else clean_env())


def wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.05):
    """Poll until predicate() is truthy; returns its last value (a liveness wait, not a timing bound)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)
