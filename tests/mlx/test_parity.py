"""Token parity on a real transformer: every request's tokens equal mlx-lm's own greedy
generation (generate_step, an oracle nobody here wrote), in every mode, for B = 1
speculation, batched classic decode, batched speculative windows and mixed traffic."""

from __future__ import annotations

import pytest
from mlx_helpers import NUM_PROMPTS, make_requests, mismatches, run

from coopsched.core.config import MODES

pytestmark = pytest.mark.mlx


@pytest.mark.parametrize("mode", MODES)
def test_b1_speculative(backend, prompts, oracle, mode):
    requests = make_requests(prompts)
    for request in requests:  # one at a time: each is a B = 1 session, never a classic fallback
        run(backend, [request], mode=mode)
    assert len(requests) >= 20 and all(r.served_speculatively for r in requests)
    assert mismatches(requests, oracle, backend.eos_token_id) == []
    assert backend.num_live == 0


@pytest.mark.parametrize("mode", MODES)
def test_batched_classic(backend, prompts, oracle, mode):
    requests = make_requests(prompts, speculative=False, arrival_step_ms=2.0)
    _, result = run(backend, requests, mode=mode, max_batch_size=8)
    widest = max(len(t.request_ids) for t in result.ticks if t.action == "decode")
    assert widest == 8, "staggered arrivals should fill the classic batch"
    assert mismatches(requests, oracle, backend.eos_token_id) == []
    assert backend.num_live == 0


@pytest.mark.parametrize("mode", MODES)
def test_batched_speculative_windows(backend, equal_prompts, oracle, mode):
    requests = make_requests(equal_prompts)
    for group in (requests[0:8], requests[8:16], requests[16:NUM_PROMPTS]):
        _, result = run(backend, group, mode=mode, enable_batch=True, max_window=8)
        windows = [t.request_ids for t in result.ticks if t.action == "prefill" and len(t.request_ids) > 1]
        assert windows == [tuple(r.id for r in group)], "the group should run as one B > 1 window"
    assert mismatches(requests, oracle, backend.eos_token_id) == []
    assert backend.num_live == 0


@pytest.mark.parametrize("mode", MODES)
def test_mixed_classic_and_speculative(backend, prompts, equal_prompts, oracle, mode):
    # Speculative rows share one length (so windows can form); classic rows vary; bursts of 4.
    mixed = [equal_prompts[i] if i % 2 == 0 else prompts[i] for i in range(NUM_PROMPTS)]
    requests = make_requests(mixed, speculative=lambda i: i % 2 == 0)
    for i, request in enumerate(requests):
        request.arrival_ms = (i // 4) * 10.0
    run(backend, requests, mode=mode, enable_batch=True)
    assert any(r.served_speculatively for r in requests)
    assert any(not r.served_speculatively for r in requests)
    assert mismatches(requests, oracle, backend.eos_token_id) == []
    assert backend.num_live == 0
