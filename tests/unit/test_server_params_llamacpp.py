"""llama.cpp's server params from what llama-server reports and counts (planted answers)."""

from __future__ import annotations

import pytest

from harness.calibrate.server_params.llamacpp import draft_cap, frontend_overhead, llamacpp_reported, step_ms

PROPS = {"total_slots": 4, "default_generation_settings": {"n_ctx": 1024}}
SLOTS = [{"id": i, "speculative": True, "n_ctx": 1024} for i in range(4)]


@pytest.mark.parametrize("props, slots, params", [
    pytest.param(PROPS, SLOTS, {"parallel": 4, "draft_model": True}, id="draft"),
    pytest.param(PROPS, [{**s, "speculative": False} for s in SLOTS], {"parallel": 4, "draft_model": False},
                 id="no-draft"),
    pytest.param({"total_slots": 2}, None, {"parallel": 2}, id="no-slots-endpoint"),
    pytest.param(None, None, {}, id="nothing-reported"),
])
def test_what_the_server_reports_becomes_params(props, slots, params):
    fitted, evidence = llamacpp_reported(props, slots)
    assert fitted == params
    assert any("batch_size" in line and "not reported" in line for line in evidence)


@pytest.mark.parametrize("drafts, tokens, cap", [
    pytest.param(28, 81, 3, id="n-max-3-tail-cut"),   # measured: a 64-token request at --spec-draft-n-max 3
    pytest.param(10, 50, 5, id="every-round-full"),
    pytest.param(30, 31, 2, id="one-round-over"),
])
def test_the_draft_cap_is_the_mean_draft_rounded_up(drafts, tokens, cap):
    assert draft_cap(drafts, tokens)[0] == cap


def test_no_drafts_keep_the_default():
    cap, line = draft_cap(0, 0)
    assert cap is None and "counted no drafts" in line


def test_frontend_time_is_the_median_gap_so_one_stall_does_not_move_it():
    ms, line = frontend_overhead([(3.0, 2.0), (2.9, 1.8), (160.0, 2.0), (3.2, 2.0), (2.5, 1.3)])
    assert ms == pytest.approx(1.2) and "160.00" not in line and "158.00" in line


@pytest.mark.parametrize("predicted, rounds, ms", [
    pytest.param([(47.0, 48), (94.0, 48)], None, 1.5, id="decode-steps-after-the-first-token"),
    pytest.param([(40.0, 48), (60.0, 48)], 20.0, 2.5, id="rounds-with-a-draft-model"),
    pytest.param([(5.0, 1), (47.0, 48)], None, 1.0, id="a-lone-token-has-no-step"),
])
def test_a_step_is_the_servers_generation_time_over_its_steps(predicted, rounds, ms):
    assert step_ms(predicted, rounds) == pytest.approx(ms)
