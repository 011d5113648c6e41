"""What calibration reads from a vLLM server's /metrics for its twin: K from the per-position
acceptance series, and the ngram acceptance that gives the counted tokens per row-step."""

from __future__ import annotations

import pytest

from harness.calibrate import fit
from harness.calibrate.server_params import vllm as sp

LABELS = 'engine="0",model_name="m"'


def scrape(k: int) -> dict[str, float]:
    """A vLLM /metrics as client.scrape_metrics reads it: each position has a _total and a _created."""
    out = {}
    for i in range(k):
        out[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{LABELS},position="{i}"}}'] = 10.0 * (k - i)
        out[f'vllm:spec_decode_num_accepted_tokens_per_pos_created{{{LABELS},position="{i}"}}'] = 1.7e9
    return out


@pytest.mark.parametrize("k", [1, 4, 5])
def test_k_is_the_number_of_positions_counted(k):
    assert sp.spec_positions(scrape(k)) == k


def test_no_speculation_has_no_positions():
    assert sp.spec_positions({f"vllm:generation_tokens_total{{{LABELS}}}": 5.0}) == 0


def counters(generated, requests, drafts, drafted, accepted) -> dict[str, float]:
    return {"vllm:generation_tokens_total": generated, "vllm:request_success_total": requests,
            "vllm:spec_decode_num_drafts_total": drafts, "vllm:spec_decode_num_draft_tokens_total": drafted,
            "vllm:spec_decode_num_accepted_tokens_total": accepted}


def test_acceptance_gives_the_counted_tokens_per_row_step():
    # 10 requests, 410 tokens: 10 first tokens, 400 from decode steps of which 150 accepted drafts ->
    # 250 row-steps of 1.6 tokens each (some with no proposal: the twin folds them in)
    before, after = counters(0, 0, 0, 0, 0), counters(410, 10, 100, 400, 150)
    accept, evidence = sp.ngram_acceptance(before, after, 4)
    assert fit.expected_tokens_per_round(accept, 5) == pytest.approx(1.6, abs=1e-6)
    assert "250 row-steps" in evidence and "40% proposed" in evidence


def test_acceptance_is_none_without_drafts():
    assert sp.ngram_acceptance(counters(0, 0, 0, 0, 0), counters(100, 2, 0, 0, 0), 4) is None
