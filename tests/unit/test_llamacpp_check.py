"""Held-out workload figures, the error rule (a target or 1.5x the live spread) and llama-server's
step books, on planted runs."""

from __future__ import annotations

import pytest

from harness.calibrate.llamacpp_check import error_row, figures, server_counters, workload


def row(arrival, times, speculative=False):
    return {"arrival_ms": arrival, "token_times_ms": times, "num_tokens": len(times), "speculative": speculative}


def test_figures_of_runs_and_their_spread():
    a = [row(0.0, [10.0, 12.0, 14.0]), row(5.0, [25.0, 26.0], speculative=True)]
    b = [row(0.0, [20.0, 24.0, 28.0]), row(5.0, [45.0, 47.0], speculative=True)]
    out = figures([a, b])
    assert [f["aggregate_tok_s"] for f in out["runs"]] == [pytest.approx(5000 / 26), pytest.approx(5000 / 47)]
    assert out["pooled"]["ttft_p50_ms"] == pytest.approx(20.0)           # of 10, 20, 20, 40
    assert out["pooled"]["itl_mean_ms"] == pytest.approx((2 + 2 + 1 + 4 + 4 + 2) / 6)
    assert out["runs"][0]["classic_itl_p99_ms"] == pytest.approx(2.0)    # the classic row's gaps only
    assert out["spread"]["ttft_p50_ms"] == pytest.approx((30.0 - 15.0) / 20.0)


@pytest.mark.parametrize("predicted, spread, within", [
    pytest.param(109.0, 0.0, True, id="inside-target"),
    pytest.param(112.0, 0.0, False, id="outside-target"),
    pytest.param(112.0, 0.10, True, id="inside-1.5x-spread"),
    pytest.param(116.0, 0.10, False, id="outside-1.5x-spread"),
])
def test_the_rule_is_the_target_or_one_and_a_half_spreads(predicted, spread, within):
    measured = {"pooled": {"aggregate_tok_s": 100.0}, "spread": {"aggregate_tok_s": spread}}
    rows = error_row({"pooled": {"aggregate_tok_s": predicted}}, measured)
    assert rows["aggregate_tok_s"]["within"] is within


def test_server_counters_undo_the_running_average_of_busy_slots():
    before = {"llamacpp:n_decode_total": 10, "llamacpp:n_busy_slots_per_decode": 1.0,
              "llamacpp:spec_decode_num_drafts_total": 4, "llamacpp:spec_decode_num_draft_tokens_total": 12}
    after = {"llamacpp:n_decode_total": 30, "llamacpp:n_busy_slots_per_decode": 2.0,
             "llamacpp:spec_decode_num_drafts_total": 24, "llamacpp:spec_decode_num_draft_tokens_total": 70}
    assert server_counters(before, after) == {"steps": 20, "busy_per_step": 2.5, "drafts": 20, "draft_tokens": 58}


def test_the_workload_is_the_same_requests_for_every_twin_seed():
    first, again = workload(10.0, 20), workload(10.0, 20)
    assert first.requests == again.requests and first.workload is None
    assert sum(r.speculative for r in first.requests) == 10
