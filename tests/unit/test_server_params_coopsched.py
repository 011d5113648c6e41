"""The coopsched fitter's decode steps from the books a calibration's passes kept: every batch size
with enough ticks, each with its share of the worker's overhead, made non-decreasing."""

from __future__ import annotations

import pytest

from harness.calibrate.server_params.coopsched import MIN_DECODE_TICKS, decode_books


def test_decode_prices_are_the_books_per_batch_size_with_the_workers_overhead():
    # 100 decode ticks and 20 rounds, 350 ms in model calls, 410 ms busy: 0.5 ms a tick outside them
    calibration = {"ticks": {"decode/1": [40, 60.0], "decode/2": [30, 90.0], "decode/3": [5, 20.0],
                             "decode/4": [25, 60.0], "round/1": [20, 120.0]}, "busy_ms": 410.0}
    points, said = decode_books(calibration)
    # B = 3 has too few ticks; B = 4 (2.4 + 0.5) under B = 2 (3.0 + 0.5) is pooled with it, by ticks
    pooled = (3.5 * 30 + 2.9 * 25) / 55
    assert points == [[1, 2.0], [2, pytest.approx(pooled, abs=1e-4)], [4, pytest.approx(pooled, abs=1e-4)]]
    assert "0.500 ms a tick" in said


def test_without_books_or_ticks_the_timing_fit_is_kept():
    assert decode_books(None)[0] is None
    few = {"ticks": {"decode/1": [MIN_DECODE_TICKS - 1, 30.0]}, "busy_ms": 40.0}
    points, said = decode_books(few)
    assert points is None and f"fewer than {MIN_DECODE_TICKS}" in said
