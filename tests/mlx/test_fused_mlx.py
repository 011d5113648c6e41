"""Fused mode on a real transformer: fused ticks (classic decode rows and speculative verify rows in
one tick: split into a decode and a verify forward, or ONE padded forward with per-row lengths and
per-row rollback) emit exactly mlx-lm's greedy tokens; so does the cost-mode arbiter, whatever K it
picks per round."""

from __future__ import annotations

import pytest
from mlx_helpers import NUM_PROMPTS, make_requests, mismatches, run

pytestmark = pytest.mark.mlx


def _mixed(prompts, equal_prompts, num: int = 12):
    """Classic rows start first; speculative rows (equal lengths, so windows can form) join them."""
    requests = make_requests([prompts[i] if i % 3 else equal_prompts[i] for i in range(num)],
                             speculative=lambda i: i % 3 == 0)
    for i, request in enumerate(requests):
        request.arrival_ms = 0.0 if not request.speculative else 5.0 * i
    return requests


@pytest.mark.parametrize("layout", ["split", "padded"])
@pytest.mark.parametrize("batched", [False, True], ids=["b1", "window"])
def test_fused_ticks_emit_the_oracles_tokens(backend, prompts, equal_prompts, oracle, batched, layout):
    backend.fused_layout = layout
    requests = _mixed(prompts, equal_prompts)
    scheduler, result = run(backend, requests, mode="fused", enable_batch=batched, max_batch_size=8)
    fused = [t for t in result.ticks if t.action == "fused"]
    spec_ids = {r.id for r in requests if r.served_speculatively}
    assert fused and all(set(t.request_ids) - spec_ids and set(t.request_ids) & spec_ids for t in fused)
    assert scheduler.obs.rounds > 0 and scheduler.obs.accepted_tokens < scheduler.obs.drafted_tokens
    assert mismatches(requests, oracle, backend.eos_token_id) == []
    assert backend.num_live == 0


@pytest.mark.parametrize("budget", [1.0, 1000.0], ids=["below-floor", "generous"])
def test_cost_mode_emits_the_oracles_tokens_at_any_k(backend, prompts, equal_prompts, oracle, budget):
    requests = _mixed(prompts, equal_prompts)
    scheduler, _ = run(backend, requests, mode="cost", hol_budget_ms=budget, max_batch_size=8)
    assert scheduler.policy.k_log
    assert mismatches(requests, oracle, backend.eos_token_id) == []
    assert backend.num_live == 0


def test_prompts_fixture_is_big_enough(prompts, equal_prompts):
    assert len(prompts) >= NUM_PROMPTS and len(equal_prompts) >= 12


def test_a_fused_forward_that_keeps_the_pads_is_caught(backend, prompts, equal_prompts, oracle, monkeypatch):
    """The parity above can fail: pad the classic rows to K and skip their rollback."""
    def no_rollback(self, decode_rows, verify_rows):
        width = max([len(d) + 1 for _, _, d in verify_rows], default=1)
        padded = [(seq_id, last, [0] * (width - 1)) for seq_id, last in decode_rows]
        out = self.verify(padded + list(verify_rows))
        return [row[0] for row in out[: len(decode_rows)]], out[len(decode_rows):]
    monkeypatch.setattr(type(backend), "fused", no_rollback)
    requests = _mixed(prompts, equal_prompts)
    run(backend, requests, mode="fused", max_batch_size=8)
    assert mismatches(requests, oracle, backend.eos_token_id) != []
