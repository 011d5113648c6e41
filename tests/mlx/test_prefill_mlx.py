"""Chunked and batched prefill on the real MLX model: every request's tokens still equal mlx-lm's
greedy generate_step (prompts of up to 300 tokens prefilled in chunks, several admissions in one
forward, chunked slices 0), in every mode; a batched prefill is one forward over the prompts (and
one over their last tokens) of the expected shapes."""

from __future__ import annotations

import itertools
import random

import pytest
from mlx_helpers import make_requests, mismatches, run
from test_backend import CountingModel

from coopsched.core import SamplingParams, TickKind
from coopsched.core.backend import PrefillRow
from coopsched.core.config import MODES

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="session")
def long_prompts(printable_ids) -> list[tuple[int, ...]]:
    """Eight prompts of 40..300 tokens, seeded."""
    rng = random.Random(2)
    return [tuple(rng.choice(printable_ids) for _ in range(rng.randint(40, 300))) for _ in range(8)]


def test_a_batched_prefill_is_one_forward_and_equals_whole_prefills(backend, prompts, long_prompts):
    rows = [PrefillRow(f"s{i}", p, 0, len(p), SamplingParams(), False)
            for i, p in enumerate([*prompts[:3], long_prompts[0]])]
    whole = backend.fresh()
    want = [whole.prefill(r.seq_id, r.prompt, r.params, False) for r in rows]
    backend.model = counting = CountingModel(backend.model)
    assert backend.prefill_batch(rows) == want
    # as generate_step: every prompt but its last token (caches only), then the last tokens (logits)
    assert counting.shapes == [(4, len(long_prompts[0]) - 1), (4, 1)]
    # the caches hold each prompt: the next decode step agrees with the whole prefills'
    assert backend.decode([(r.seq_id, t) for r, t in zip(rows, want)]) == \
        whole.decode([(r.seq_id, t) for r, t in zip(rows, want)])


def test_chunks_continue_a_prompt_and_only_the_last_one_samples(backend, long_prompts):
    prompt = long_prompts[1]
    want = backend.fresh().prefill("x", prompt, SamplingParams(), True)
    cuts = [0, 64, 128, len(prompt)]
    got = [backend.prefill_batch([PrefillRow("x", prompt, a, b, SamplingParams(), True)])[0]
           for a, b in itertools.pairwise(cuts)]
    assert got == [None, None, want]
    with pytest.raises(ValueError, match="cache holds"):
        backend.prefill_batch([PrefillRow("x", prompt, 10, 20, SamplingParams(), False)])
    backend.release("x")
    assert backend.num_live == 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("chunk, batch", [(64, 1), (48, 4), (0, 8)], ids=["chunked", "chunked-batched", "batched"])
def test_parity_with_chunked_and_batched_prefill(backend, long_prompts, prompts, oracle, mode, chunk, batch):
    mixed = [p for pair in zip(long_prompts, prompts) for p in pair]  # long and short, alternating
    requests = make_requests(mixed, speculative=lambda i: i % 3 == 0)
    for i, request in enumerate(requests):
        request.arrival_ms = (i // 4) * 15.0  # bursts of four: admissions batch, chunks interleave decode
    _, result = run(backend, requests, mode=mode, prefill_chunk_tokens=chunk, max_batch_prefill=batch,
                    max_batch_size=8)
    assert mismatches(requests, oracle, backend.eos_token_id) == []
    assert backend.num_live == 0
    kinds = {t.kind for t in result.ticks}
    if chunk:
        assert TickKind.CHUNK in kinds
        # a speculative slice 0 is chunked too; not in burst, nor where upstream's batched prefill
        # (slice, max_batch_prefill > 1, two or more queued) admits every queued row classically
        bypassed = mode == "slice" and batch > 1
        assert any(t.kind is TickKind.CHUNK and t.action == "spec_round" for t in result.ticks) or mode == "burst" \
            or bypassed
    if batch > 1:
        assert max(len(t.request_ids) for t in result.ticks if t.action == "prefill" and not t.kind.is_spec_admission
                   and t.kind is not TickKind.PARK) > 1
