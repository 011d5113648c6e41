"""`coopsched calibrate --report` on the real MLX backend: the mock, priced by a profile calibrated from
the engine's own ticks, predicts a fixed workload in every mode; and it predicts which side of the
legacy burst fused mode's throughput falls on when the fused forward pads every row to K.

Wall time on a shared 2-core CPU: calibration passes and checked runs are interleaved so both see the
same machine, and a miss gets one more attempt. Above LOADED runnable tasks per core (other sessions'
work) MLX's threads share the cores and the errors measure the neighbours, not the twin (aggregate
tokens/s within 7% at a load average of 0.8-0.9 on 2 cores, -15% to -22% at 2.4, 20-60% at 5-7): two
misses then skip, naming the errors and the load, rather than fail.
"""

from __future__ import annotations

import json
import os

import pytest

from coopsched import cli
from coopsched.backends.mlx_backend import MlxBackend
from coopsched.core import MODES
from harness.calibrate import twin
from harness.calibrate.ticks import TickCalibration
from harness.run import scenario
from mocks import CostModel

pytestmark = [pytest.mark.mlx, pytest.mark.twins]

BOUNDS = {"aggregate_tok_s": 0.15, "classic_itl_p50_ms": 0.15, "classic_itl_p99_ms": 0.30}
LOADED = 1.0  # load average per core


def misses(report: dict) -> list[str]:
    return [f"{mode}/{metric}: {rows[metric]['error']:+.1%}" for mode, rows in report["modes"].items()
            for metric, bound in BOUNDS.items() if abs(rows[metric]["error"]) > bound]


def test_the_twin_predicts_every_mode(models, tmp_path):
    attempts = []
    for attempt in range(2):
        profile, report = tmp_path / f"profile{attempt}.json", tmp_path / f"report{attempt}.json"
        argv = ["calibrate", "--model", str(models.target), "--draft-model", str(models.draft), "--out", str(profile),
                "--report", str(report), "--no-check", "--repeats", "5", "--report-runs", "5"]
        assert cli.main(argv) == 0
        data = json.loads(report.read_text())
        assert set(data["modes"]) == set(MODES)
        assert all(set(rows) >= {"aggregate_tok_s", "classic_itl_p50_ms", "classic_itl_p99_ms", "spec_tok_s",
                                 "ttft_p95_ms"} for rows in data["modes"].values())
        attempts.append((misses(data), max(data["load_average"])))
        if not attempts[-1][0]:
            return
    if min(load for _, load in attempts) > LOADED * (os.cpu_count() or 1):
        pytest.skip(f"the machine is loaded (load average per attempt: {[a[1] for a in attempts]} on "
                    f"{os.cpu_count()} cores): wall-time errors {attempts}")
    pytest.fail(f"the twin missed on both attempts (misses, peak load average): {attempts}")


@pytest.mark.parametrize("layout", ["padded", "split"])
def test_fused_vs_burst_is_predicted(models, layout):
    """many-classic (8 classic rows beside one speculative request): padding every row to K makes a fused
    step compute 9 x K positions, and both the twin and the backend lose to the burst; split, neither
    gains much on this CPU (a forward costs about the same per position either way), and the twin's
    ratio stays near the measured one."""
    backend = MlxBackend(models.target, models.draft, fused_layout=layout)
    scen = scenario.load("many-classic")
    config = lambda mode: twin.twin_config(mode, 4, max_batch_size=16)
    TickCalibration(lambda _c: backend.fresh()).run_pass()  # warm-up
    calibration = TickCalibration(lambda _c: backend.fresh())
    measured: dict[str, list] = {"burst": [], "fused": []}
    for i in range(3):
        calibration.run_pass()
        for mode in measured:
            measured[mode].append(twin.measure_in_process(backend.fresh, config(mode), i, scenario=scen))
    profile = calibration.profile(fused_padding=layout)
    profile.pop("fit")
    cost = CostModel(**profile)
    agg = lambda runs: twin.pooled(runs)["aggregate_tok_s"]
    predicted = agg(twin.simulate(cost, config("fused"), range(3), scenario=scen)) / \
        agg(twin.simulate(cost, config("burst"), range(3), scenario=scen))
    real = agg(measured["fused"]) / agg(measured["burst"])
    context = f"predicted {predicted:.3f}, measured {real:.3f}, load average {os.getloadavg()}"
    if layout == "padded":
        assert predicted < 0.9 and real < 0.9, context
    else:  # measured 0.95-1.18 x burst over a dozen runs; the twin 0.95-1.02
        assert 0.75 < predicted < 1.3 and 0.75 < real < 1.3, context
