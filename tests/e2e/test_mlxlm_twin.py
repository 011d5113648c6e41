"""The mlx-lm twin predicts mlx_lm.server (tiny model, no draft model) on a held-out open-loop
workload: calibrated as a user would (tools/mlxlm_twin.py calibrate: `calibrate --target`'s cost terms,
then the scheduler parameters the server does not report), then the workload live three times and on
the twin. Every metric within its target or 1.5x the live runs' spread; on a quiet machine the cost-only
twin (coopsched's scheduler at the same costs) misses on the same runs, so the rule can fail (under load
the spread widens every limit and that half is skipped, naming the load; a miss on a machine loaded
above one runnable task per core, after one more attempt, skips with the errors). ~1.5-2.5 minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_servers import clean_env, serve

from harness.calibrate.heldout import TOLERANCE
from harness.live.client import free_port

pytestmark = pytest.mark.e2e
TOOL = Path(__file__).resolve().parents[2] / "tools" / "mlxlm_twin.py"


@pytest.fixture(scope="module")
def tiny_model():
    pytest.importorskip("mlx_lm")
    from coopsched.backends.model_build import ensure_tiny_models

    return ensure_tiny_models()[0]


def tool(*args: str) -> str:
    proc = subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=400,
                          env=clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_the_mlx_lm_twin_predicts_a_held_out_workload(tmp_path, tiny_model):
    port = free_port()
    command = [sys.executable, "-m", "mlx_lm", "server", "--model", str(tiny_model), "--host", "127.0.0.1",
               "--port", str(port), "--log-level", "WARNING"]
    profile, report = tmp_path / "p.json", tmp_path / "r.json"
    with serve(command=command, port=port, env=clean_env(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")) \
            as served:
        tool("calibrate", served.url, str(profile))
        for _ in range(2):  # one more attempt: the neighbours' load moves between calibration and the runs
            output = tool("check", served.url, str(profile), "--rate", "4", "--requests", "30", "--runs", "3",
                          "--json", str(report))
            metrics = json.loads(report.read_text())["metrics"]
            if all(row["after"]["within"] for row in metrics.values()):
                break
    params = json.loads(profile.read_text())["server_params"]
    assert params["draft_model"] is False and params["prompt_concurrency"] == 8  # the server's defaults
    assert 400 <= params["wave_ms"] <= 650  # its 0.5 s time budget, plus a step
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    missed = [m for m, row in metrics.items() if not row["after"]["within"]]
    if missed and load > cores:  # wall time then measures the neighbours (as tests/mlx/test_twin_mlx.py)
        pytest.skip(f"at a load average of {load:.1f} on {cores} cores the twin missed {', '.join(missed)} "
                    f"twice:\n{output}")
    assert not missed, output
    if load > cores:  # the live runs' spread loosened every limit: nothing can miss it
        limits = ", ".join(f"{m} {row['limit']:.0%}" for m, row in metrics.items())
        pytest.skip(f"the mlx-lm twin held; whether the cost-only twin misses is not told at a load average of "
                    f"{load:.1f} (limits {limits})")
    # the cost-only twin is further off than a tolerance on some figure (the spread may still excuse it)
    assert any(row["before"]["error"] is not None and abs(row["before"]["error"]) > TOLERANCE[m]
               for m, row in metrics.items()), output
