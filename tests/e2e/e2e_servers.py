"""Servers on loopback for the e2e tests: `coopsched serve --port 0` in a subprocess.

The server prints its real port on its first stderr line; the rest of stderr
(BurstFinalized JSON lines) is drained by a thread so the pipe never blocks it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx

GATE_PREFIX = "MLXCEL_"


@dataclass
class Served:
    url: str
    proc: subprocess.Popen
    log: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics as {'name{labels}': value}."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def clean_env(**gates: str) -> dict:
    """The environment without any MLXCEL_* gate of the caller's, plus `gates`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(GATE_PREFIX)}
    env.update(gates)
    return env


@contextmanager
def serve(*args: str, env: dict | None = None, command: list[str] | None = None):
    cmd = command or [sys.executable, "-m", "coopsched.cli", "serve", "--port", "0", *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env=env if env is not None else clean_env())
    served = None
    try:
        first = proc.stderr.readline()
        match = re.search(r"listening on (http://[\d.]+:\d+)", first)
        if not match:
            proc.kill()
            raise RuntimeError(f"server did not start: {first}{proc.stderr.read()}")
        served = Served(match.group(1), proc)
        threading.Thread(target=lambda: served.log.extend(proc.stderr), daemon=True).start()
        wait_healthy(served.url)
        yield served
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_healthy(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}/health never answered 200")
        time.sleep(0.05)


def wait_for(predicate, timeout_s: float = 10.0, interval_s: float = 0.05):
    """Poll until predicate() is truthy; returns its last value (a liveness wait, not a timing bound)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)
