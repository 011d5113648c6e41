"""Where sweep points run: in this process, in J forked local processes, or on a Dask cluster.

Points are independent and pure (virtual time, seeded, configs built by the caller), so
every runner computes the same points; results are put back in task order, so the sweep
JSON is byte-identical whatever ran them. dask.distributed is imported only for --cluster.
"""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed

from harness.sweep.points import SweepError, Task, run_point

OnDone = Callable[[dict], None]
CLUSTER_TIMEOUT_S = 10.0


def run_local(tasks: Sequence[Task], jobs: int = 1, on_done: OnDone | None = None) -> list[dict]:
    """jobs = 1: here, one after another (a monkeypatched scheduler applies); else J forked processes."""
    if jobs <= 1 or len(tasks) <= 1:
        results = []
        for task in tasks:
            results.append(run_point(task))
            if on_done:
                on_done(results[-1])
        return results
    out: list[dict | None] = [None] * len(tasks)
    # fork, as `coopsched simulate`: the workers start at once, with this process's imports
    with ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {pool.submit(run_point, task): i for i, task in enumerate(tasks)}
        for future in as_completed(futures):
            out[futures[future]] = result = future.result()
            if on_done:
                on_done(result)
    return [p for p in out if p is not None]


def check_address(address: str) -> str:
    host, sep, port = address.removeprefix("tcp://").rpartition(":")
    if not address.startswith("tcp://") or not sep or not host or not port.isdigit():
        raise SweepError(f"--cluster {address!r}: want the address of a running Dask scheduler, "
                         "tcp://HOST:PORT (e.g. tcp://10.0.0.5:8786)")
    return address


def run_cluster(tasks: Sequence[Task], address: str, on_done: OnDone | None = None,
                timeout_s: float | None = None) -> list[dict]:
    """The points on an existing Dask scheduler's workers (which need coopsched installed)."""
    check_address(address)
    timeout_s = CLUSTER_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        from distributed import Client
        from distributed import as_completed as completed
    except ImportError:
        raise SweepError("--cluster needs dask.distributed: pip install -e '.[cluster]'") from None
    try:
        client = Client(address, timeout=timeout_s, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise SweepError(f"--cluster {address}: no Dask scheduler answered within {timeout_s:g} s ({exc})") from None
    with client:
        try:
            client.wait_for_workers(1, timeout=timeout_s)
        except TimeoutError:
            raise SweepError(f"--cluster {address}: the scheduler has no worker (none joined within "
                             f"{timeout_s:g} s); start one with `dask worker {address}`") from None
        batch = uuid.uuid4().hex[:12]
        futures = client.map(run_point, list(tasks), key=[f"coopsched-sweep-{batch}-{t.index}" for t in tasks])
        index = {future.key: i for i, future in enumerate(futures)}
        out: list[dict | None] = [None] * len(tasks)
        for future in completed(futures, loop=client.loop):
            out[index[future.key]] = result = future.result()
            if on_done:
                on_done(result)
    return [p for p in out if p is not None]
