"""The pytest-benchmark suite: one tick at B = 1, 8, 64 on a zero-cost mock, and every scenario x mode.

Benchmarks report, tests assert: wall-time figures (tick time, simulated tokens
per CPU-second, virtual/wall ratio) go in the stored files and are never gated;
the tracked virtual-time metrics go in `extra_info` too and are gated against
the committed baseline (reports/baseline/), failing by name when worse by > 1%.
"""

from __future__ import annotations

import time
import warnings

import pytest

from coopsched.core import MODES
from harness.report import gate
from harness.run import runner, scenario

pytestmark = pytest.mark.bench
SEED = 0
PAIRS = [(name, mode) for name in scenario.available() for mode in MODES]


@pytest.mark.benchmark(group="tick", max_time=0.4, min_rounds=20)
@pytest.mark.parametrize("num_rows", [1, 8, 64], ids=lambda b: f"B={b}")
def test_tick(benchmark, engine_with_rows, num_rows):
    engine = engine_with_rows(num_rows)
    record = benchmark(engine.step).record
    assert record.action == "decode" and len(record.request_ids) == num_rows
    assert engine.clock.now() == 0.0  # zero-cost: the tick is pure scheduler CPU
    benchmark.extra_info.update(kind="tick", batch_size=num_rows)
    if benchmark.stats:  # None under --benchmark-disable
        benchmark.extra_info["rows_per_s"] = round(num_rows / benchmark.stats.stats.mean, 1)


@pytest.mark.benchmark(group="scenario")
@pytest.mark.parametrize(("name", "mode"), PAIRS, ids=[f"{n}-{m}" for n, m in PAIRS])
def test_scenario(benchmark, name, mode):
    scen = scenario.load(name)
    config = runner.scenario_config(scen, mode)
    run = benchmark.pedantic(runner.execute, args=(scen, config, SEED), rounds=3, iterations=1)
    cpu_start = time.process_time()
    runner.execute(scen, config, SEED)
    cpu_s = time.process_time() - cpu_start

    trace = runner.run_scenario(scen, mode, SEED)
    tracked = gate.tracked_metrics(trace)
    tokens = sum(len(r.output_token_ids) for r in run.requests)
    virtual_ms = max(t.end_ms for t in run.ticks) - min(r.arrival_ms for r in run.requests)
    benchmark.extra_info.update(
        kind="scenario", scenario=name, mode=mode, seed=SEED, **tracked,
        checks_ok=all(c["ok"] for c in trace["checks"]), tokens=tokens, virtual_ms=round(virtual_ms, 6),
        cpu_s=cpu_s, tokens_per_cpu_s=round(tokens / cpu_s, 1) if cpu_s > 0 else None)
    if benchmark.stats:  # None under --benchmark-disable
        benchmark.extra_info["virtual_wall_ratio"] = round(virtual_ms / (1e3 * benchmark.stats.stats.mean), 2)

    # the regression gate, for this scenario x mode (virtual time: exact, no noise)
    baseline = gate.load_baseline().get(name, {})
    benchmark.extra_info["gated"] = mode in baseline
    if mode not in baseline:
        warnings.warn(f"{name}/{mode} is not in reports/baseline yet: stored, not gated until "
                      "`coopsched report --update-baseline` moves the baseline", stacklevel=1)
        return
    failed = gate.failures(gate.compare({name: {mode: tracked}}, {name: {mode: baseline[mode]}}))
    assert not failed, gate.explain(failed)
