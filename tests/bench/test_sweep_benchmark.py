"""The sweep benchmark: 4 modes x 6 rates x 3 seeds of a 200-request workload at --jobs 1 and 2.

Benchmarks report, tests assert: each run's wall time goes in `extra_info` (with the speed-up
of --jobs 2 over --jobs 1 when both ran), never gated; the capacities are virtual-time results,
exact, and both job counts must write the same JSON.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from coopsched.core import MODES
from harness.run import scenario
from harness.run.slo import Slo
from harness.sweep.cli import Settings, Sweep, dumps

pytestmark = pytest.mark.bench
WORKLOAD = Path(__file__).resolve().parent / "workloads" / "sweep-mix-200.toml"
RATES = (2, 4, 6, 8, 10, 12)
SEEDS = 3
SLO = Slo(itl_ms=250.0, ttft_ms=1000.0)  # the README's poisson-mix SLO
DONE: dict[int, tuple[float, str]] = {}   # jobs -> (wall s, sweep JSON)


@pytest.mark.benchmark(group="sweep")
@pytest.mark.parametrize("jobs", [1, 2], ids=lambda j: f"jobs={j}")
def test_sweep(benchmark, jobs):
    settings = Settings(scenario.load(str(WORKLOAD)), "rate", RATES, MODES, SEEDS, SLO, 0.9, jobs)
    walls: list[float] = []

    def timed() -> dict:
        start = time.perf_counter()
        result = Sweep(settings).run()
        walls.append(time.perf_counter() - start)
        return result

    result = benchmark.pedantic(timed, rounds=1, iterations=1)
    text = dumps(result)
    DONE[jobs] = (walls[-1], text)
    assert len(result["points"]) == len(MODES) * len(RATES) * SEEDS
    assert all(p["requests"] == 200 for p in result["points"])
    benchmark.extra_info.update(
        kind="sweep", jobs=jobs, cpus=os.cpu_count(), points=len(result["points"]), requests_per_point=200,
        wall_s=round(walls[-1], 3), points_per_s=round(len(result["points"]) / walls[-1], 2),
        capacity=result["capacity"])
    if jobs != 1 and 1 in DONE:
        benchmark.extra_info["speedup_vs_jobs1"] = round(DONE[1][0] / walls[-1], 3)
        assert text == DONE[1][1]  # the same bytes whatever ran the points
