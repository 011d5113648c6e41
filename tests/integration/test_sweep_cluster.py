"""`coopsched sweep --cluster tcp://HOST:PORT`: the points on a Dask scheduler and worker started
here on loopback give the bytes of a local run; a scheduler that is not there, or has no worker,
is a one-line error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from factories import mixed_workload

from coopsched.cli import main as cli
from harness.live.client import free_port
from harness.sweep import dispatch

pytest.importorskip("distributed", reason="dask.distributed is the `cluster` extra: pip install -e '.[cluster]'")
REPO = Path(__file__).resolve().parents[2]
MIXED = mixed_workload()


@contextmanager
def dask(*args: str, log: Path):
    """`python -m dask ARGS` on loopback, stopped (SIGTERM, then SIGKILL) when the block ends."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "DASK_TEMPORARY_DIRECTORY": str(log.parent / "dask-scratch")}  # not /tmp/dask-scratch-space
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "dask", *args], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for_file(path: Path, proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.stat().st_size):
        assert proc.poll() is None and time.monotonic() < deadline, "the dask scheduler did not start"
        time.sleep(0.05)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # sweeps store reports/sweeps/latest.json under the working directory
    monkeypatch.setattr(dispatch, "CLUSTER_TIMEOUT_S", 2.0)
    (tmp_path / "mixed.toml").write_text(MIXED)
    return tmp_path


def test_a_cluster_sweep_equals_the_local_one(in_tmp, capsys):
    sweep = ["sweep", "mixed.toml", "--rates", "2,6", "--mode", "burst", "--seeds", "2", "--slo", "itl_ms=250"]
    assert cli([*sweep, "--jobs", "1", "--json", "local.json"]) == 0
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    with dask("scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard",
              "--scheduler-file", str(in_tmp / "scheduler.json"), log=in_tmp / "scheduler.log") as scheduler:
        wait_for_file(in_tmp / "scheduler.json", scheduler)
        assert json.loads((in_tmp / "scheduler.json").read_text())["address"] == address
        capsys.readouterr()
        assert cli([*sweep, "--cluster", address]) == 2  # no worker yet: said, not waited on forever
        assert "the scheduler has no worker" in capsys.readouterr().out
        with dask("worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard", "--host", "127.0.0.1",
                  "--local-directory", str(in_tmp / "worker"), log=in_tmp / "worker.log"):
            joined(address)  # a worker's start on a loaded machine outlasts the sweep's 2 s wait for one
            assert cli([*sweep, "--cluster", address, "--json", "cluster.json"]) == 0
    assert (in_tmp / "cluster.json").read_bytes() == (in_tmp / "local.json").read_bytes()


def joined(address: str, timeout_s: float = 120.0) -> None:
    """Returns once the scheduler at `address` has a worker (dask's own wait)."""
    from distributed import Client

    with Client(address, timeout=timeout_s) as client:
        client.wait_for_workers(1, timeout=timeout_s)


def test_no_scheduler_at_the_address_is_one_line(in_tmp, capsys):
    address = f"tcp://127.0.0.1:{free_port()}"
    assert cli(["sweep", "mixed.toml", "--rates", "2", "--cluster", address]) == 2
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and out.startswith(f"error: --cluster {address}: no Dask scheduler answered")
