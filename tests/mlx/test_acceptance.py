"""Acceptance counters on a real drafter: they equal what the drafter's proposals really
matched of the target's greedy stream; the target as its own drafter is always accepted;
the drafter's noise controls acceptance."""

from __future__ import annotations

import pytest
from mlx_helpers import BLOCK_SIZE, make_requests, mismatches, record_drafts, run

from coopsched.backends.mlx_backend import MlxBackend

pytestmark = pytest.mark.mlx


def true_matches(stream: list[int], rounds: list[list[int]]) -> list[tuple[int, int]]:
    """(output position, drafts matched) per round, walking the oracle's stream, not verify's."""
    out, position = [], 1  # slice 0 emitted the first token
    for drafts in rounds:
        matched = next((i for i, d in enumerate(drafts) if d != stream[position + i]), len(drafts))
        out.append((position, matched))
        position += matched + 1
    return out


def acceptance(scheduler) -> float:
    return scheduler.obs.accepted_tokens / scheduler.obs.drafted_tokens


def run_b1(backend, prompts, **config):
    """Each prompt as its own B = 1 session; one scheduler's counters over all of them is the sum."""
    requests = make_requests(prompts)
    totals = [0, 0]
    for request in requests:
        scheduler, _ = run(backend, [request], **config)
        totals[0] += scheduler.obs.accepted_tokens
        totals[1] += scheduler.obs.drafted_tokens
    return requests, totals[0] / totals[1]


@pytest.mark.parametrize("shape", ["b1", "window"])
def test_counters_equal_what_the_drafter_really_matched(backend, loaded, prompts, equal_prompts, oracle, shape):
    drafts = record_drafts(backend)
    if shape == "b1":
        requests = make_requests(prompts[:8])
        schedulers = [run(backend, [r])[0] for r in requests]
    else:
        requests = make_requests(equal_prompts[:8])
        schedulers = [run(backend, requests, enable_batch=True)[0]]
    assert mismatches(requests, oracle, backend.eos_token_id) == []
    records = {b.seq_id: b for s in schedulers for b in s.obs.bursts}
    total = 0
    for request in requests:
        stream = oracle(request.prompt_token_ids)
        walked = true_matches(stream, drafts[request.id])
        for proposals, (position, _) in zip(drafts[request.id], walked):
            context = request.prompt_token_ids + tuple(stream[:position])
            # the proposals are the drafter's own greedy continuation, not something verify saw
            assert proposals == oracle(context, BLOCK_SIZE - 1, model=loaded.draft_model)
        accepted = sum(m for _, m in walked)
        assert records[request.id].rounds == len(walked)
        assert records[request.id].accepted_draft_tokens == accepted, request.id
        total += accepted
    assert sum(s.obs.accepted_tokens for s in schedulers) == total
    assert sum(s.obs.drafted_tokens for s in schedulers) == sum(len(d) for v in drafts.values() for d in v)
    assert 0 < total < sum(s.obs.drafted_tokens for s in schedulers)  # some accepted, some not


def test_target_as_its_own_drafter_accepts_every_draft(models, prompts, equal_prompts, oracle):
    backend = MlxBackend(models.target, models.target)
    requests, rate = run_b1(backend, prompts)
    assert rate == 1.0
    window = make_requests(equal_prompts[:8], prefix="w")
    scheduler, _ = run(backend, window, enable_batch=True)
    assert scheduler.obs.accepted_tokens == scheduler.obs.drafted_tokens > 0
    assert mismatches(requests + window, oracle, backend.eos_token_id) == []


def test_noise_controls_acceptance(backend, models, prompts, oracle):
    noisy = MlxBackend(models.target, models.draft_noisy)
    _, low_noise = run_b1(backend, prompts)
    requests, high_noise = run_b1(noisy, prompts)
    print(f"acceptance: noise 0.05 -> {low_noise:.3f}, noise 0.2 -> {high_noise:.3f}")
    assert 0.0 < high_noise and low_noise < 1.0
    assert low_noise >= high_noise + 0.15, (low_noise, high_noise)
    assert mismatches(requests, oracle, noisy.eos_token_id) == []  # parity whatever the drafter
