"""`coopsched calibrate`: a profile the mock loads (CostModel field names), measured on the
MLX backend, and the calibrated mock compared with MLX on a concurrency2-like run.
Structure only: wall-clock values are never asserted."""

from __future__ import annotations

import json

import pytest

from coopsched import cli
from coopsched.backends import calibrate
from mocks import CostModel

pytestmark = pytest.mark.mlx

FIELDS = ("prefill_fixed_ms", "prefill_per_token_ms", "draft_prefill_per_token_ms", "decode_ms",
          "draft_per_token_ms", "verify_ms")


def test_measure_gives_a_loadable_monotone_profile(backend):
    profile = calibrate.measure(backend, block_size=4, repeats=1)
    assert set(FIELDS) <= set(profile)
    cost = CostModel(**profile)
    assert [b for b, _ in profile["decode_ms"]] == list(calibrate.DECODE_BATCHES)
    assert [w for w, _ in profile["verify_ms"]] == [1, 2, 3, 4, 8, 16, 32]
    for points in (profile["decode_ms"], profile["verify_ms"]):
        values = [ms for _, ms in points]
        assert values == sorted(values) and values[0] > 0
    assert cost.round(4) > cost.decode(1) > 0
    assert backend.num_live == 0  # every measurement sequence was released


def test_cli_writes_a_profile_that_mock_runs_load(models, tmp_path, capsys):
    out = tmp_path / "profile.json"
    argv = ["calibrate", "--model", str(models.target), "--draft-model", str(models.draft),
            "--out", str(out), "--repeats", "1", "--check-runs", "1"]
    assert cli.main(argv) == 0
    data = json.loads(out.read_text())
    CostModel.load(out)  # what `coopsched run --cost PROFILE.json` does
    check = data["check_concurrency2"]
    for metric in calibrate.METRICS:
        assert set(check[metric]) == {"mlx", "mock", "error"}
        assert check[metric]["mlx"]["mean"] > 0 and check[metric]["mock"]["p99"] > 0
    assert "concurrency2" in capsys.readouterr().out
    assert cli.main(["calibrate", "--model", str(models.target), "--out", str(out)]) == 2
