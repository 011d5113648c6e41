"""What the e2e tests add to the live client (harness/live/client.py): a gate-free environment.

Servers are spawned by `harness.live.client.spawn_server` (free loopback port, /health,
SIGTERM on exit); `serve` only gives them an environment without the caller's MLXCEL_*
gates, so a developer's shell cannot change what a test sees. `complete_together` sends
greedy completions at once, as the counter tests do.
"""

from __future__ import annotations

import os
import threading
import time

import httpx

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


def complete(url: str, prompt: str, max_tokens: int, speculative: bool, **extra) -> dict:
    """One greedy `/v1/completions` request (`extra`: more body fields); its JSON response."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "speculative": speculative, **extra}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()



def complete_together(url: str, jobs, **extra) -> list[dict]:
    """Each (prompt, max_tokens, speculative) job sent at once, a thread each; the responses in job order."""
    responses: list = [None] * len(jobs)

    def send(i: int) -> None:
        responses[i] = complete(url, *jobs[i], **extra)
    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return responses
