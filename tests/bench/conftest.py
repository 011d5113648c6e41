"""Bench fixtures: a scheduler with B classic rows on a zero-cost mock, and the reports (and the sweep) that
the report tests share, each built once a session."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from factories import mixed_workload

from coopsched import cli
from coopsched.clock import ManualClock
from coopsched.core import MODES, Request, Scheduler, SchedulerConfig
from coopsched.engine import Engine
from harness.report import build as report_build
from harness.report import gate
from harness.run import runner, scenario
from harness.sweep.cli import STORE as SWEEP_STORE
from mocks import CostModel, MockBackend

# every charge is free (decode and verify at 0 ms): a tick costs only the scheduler's own CPU
ZERO_COST = CostModel(prefill_fixed_ms=0, prefill_per_token_ms=0, draft_prefill_per_token_ms=0,
                      decode_ms=[[1, 0]], draft_per_token_ms=0, verify_ms=[[1, 0]])
EFFECTIVELY_ENDLESS = 10**9


def make_engine(num_rows: int, prompt_len: int = 8) -> Engine:
    """An engine whose decode batch holds `num_rows` classic rows that never finish."""
    config = SchedulerConfig(max_batch_size=num_rows, num_kv_slots=num_rows,
                             slot_tokens=EFFECTIVELY_ENDLESS + prompt_len)
    clock = ManualClock()
    engine = Engine(Scheduler(config), MockBackend(clock, ZERO_COST), clock)
    for i in range(num_rows):
        engine.scheduler.submit(Request(id=f"r{i}", prompt_token_ids=tuple(range(1, prompt_len + 1)),
                                        max_tokens=EFFECTIVELY_ENDLESS, speculative=False))
    while len(engine.scheduler.running) < num_rows:  # admit every row (one prefill tick each)
        engine.step()
    return engine


@pytest.fixture
def engine_with_rows():
    return make_engine


# -- the built reports the report tests share (building one draws ~20 PNGs: 5-10 s each time) ------------
REPO = Path(__file__).resolve().parents[2]


def bench_run(storage: Path) -> None:
    """One real bench run (a small slice of the suite) saved by pytest-benchmark into `storage`."""
    suite = "tests/bench/test_benchmarks.py"
    ids = [f"{suite}::test_tick[B=1]"] + [f"{suite}::test_scenario[concurrency2-{m}]" for m in MODES]
    cmd = [sys.executable, "-m", "pytest", *ids, "-m", "bench", "-q", "-p", "no:cacheprovider",
           f"--benchmark-storage={storage}", "--benchmark-autosave"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.fixture(scope="session")
def swept(tmp_path_factory):
    """One small sweep with --out, run in its own working directory (where it is stored): (dir, sweep)."""
    where = tmp_path_factory.mktemp("sweep")
    (where / "mixed.toml").write_text(mixed_workload())
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(where)
        assert cli.main(["sweep", "mixed.toml", "--rates", "2,6", "--seeds", "2", "--slo",
                         "itl_ms=250,ttft_ms=1000", "--json", "s.json", "--out", "page"]) == 0
    return where, json.loads((where / "s.json").read_text())


@pytest.fixture(scope="session")
def built(tmp_path_factory, swept):
    """`coopsched report` over two real stored bench runs, showing the stored sweep: (storage, out, data.json)."""
    storage = tmp_path_factory.mktemp("benchmarks")
    bench_run(storage)
    bench_run(storage)
    out = tmp_path_factory.mktemp("report")
    assert cli.main(["report", "--out", str(out), "--storage", str(storage),
                     "--sweep", str(swept[0] / SWEEP_STORE)]) == 0
    return storage, out, json.loads((out / "data.json").read_text())


@pytest.fixture(scope="session")
def bare(tmp_path_factory):
    """A report of one trace with no stored bench run and no sweep: (Report, out)."""
    where = tmp_path_factory.mktemp("bare")
    traces = [runner.run_scenario(scenario.load("concurrency2"), "slice")]
    out = where / "out"
    made = report_build.build(out, where / "no-runs", gate.BASELINE_DIR, 0, traces=traces, sweep_path=where / "none")
    return made, out
