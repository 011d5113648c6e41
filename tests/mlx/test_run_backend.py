"""`coopsched run --backend mlx`: the scenarios run in real time on the tiny models and
write the same trace JSON, with "clock": "real" and the tokens of speculation forced off.
Timing checks are the harness's business; here only the trace and parity are asserted."""

from __future__ import annotations

import json

import pytest

from coopsched import cli

pytestmark = pytest.mark.mlx


def test_run_concurrency2_on_mlx_writes_a_real_clock_trace(models, tmp_path):
    out = tmp_path / "trace.json"
    cli.main(["run", "concurrency2", "--backend", "mlx", "--mode", "slice", "--model", str(models.target),
              "--draft-model", str(models.draft), "--json", str(out)])
    (trace,) = json.loads(out.read_text())
    assert trace["clock"] == "real" and trace["scenario"] == "concurrency2"
    spec = next(r for r in trace["requests"] if r["id"] == "spec")
    assert spec["speculative"] and len(spec["token_ids"]) == len(spec["token_times_ms"]) > 0
    checks = {c["name"]: c for c in trace["checks"]}
    assert checks["parity"]["ok"] and checks["kv_released"]["ok"]
    assert trace["observability"]["accepted_tokens"] < trace["observability"]["drafted_tokens"]
