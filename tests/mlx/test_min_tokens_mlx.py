"""min_tokens and ignore_eos on a real transformer: every request's tokens equal mlx-lm's own
generate_step with a logits processor that masks EOS (the oracle), speculative and classic, in
every mode; a drafter that is the target itself still has every draft kept.

The tiny models never sample their real EOS (its lm_head row is zero), so each prompt's EOS is
set to the token its greedy stream repeats most: then EOS keeps coming back, and min_tokens has
something to suppress."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import pytest
from mlx_helpers import BLOCK_SIZE, MAX_TOKENS, record_drafts, run
from mlx_lm.generate import generate_step

from coopsched.backends.mlx_backend import MlxBackend
from coopsched.core import FinishReason, Request, SamplingParams
from coopsched.core.config import MODES

pytestmark = pytest.mark.mlx

NUM_PROMPTS = 6
CASES = [(0, False), (6, False), (13, False), (1, True)]  # (min_tokens, ignore_eos)


def frequent_token(oracle, prompt) -> int:
    return Counter(oracle(prompt, MAX_TOKENS)).most_common(1)[0][0]


_memo: dict = {}


def masked_oracle(model, prompt, eos: int, sampling: SamplingParams) -> list[int]:
    """generate_step's greedy tokens with EOS masked while `sampling` forbids it, cut before EOS."""
    key = (prompt, eos, sampling.min_tokens, sampling.ignore_eos)
    if key not in _memo:
        def processor(tokens: mx.array, logits: mx.array) -> mx.array:
            if sampling.suppresses_eos(len(tokens) - len(prompt)):
                return mx.where(mx.arange(logits.shape[-1]) == eos, -mx.inf, logits)
            return logits

        out = []
        for token, _ in generate_step(mx.array(list(prompt)), model, max_tokens=MAX_TOKENS,
                                      logits_processors=[processor]):
            if int(token) == eos:
                break
            out.append(int(token))
        _memo[key] = out
    return _memo[key]


@pytest.mark.parametrize("mode", MODES)
def test_lengths_and_tokens_equal_a_masked_generate_step(loaded, prompts, oracle, mode):
    """Each prompt as 8 concurrent requests (4 EOS settings x speculative/classic): classic rows
    batch, speculative ones share a window; every one equals the oracle."""
    requests_seen = []
    for p, prompt in enumerate(prompts[:NUM_PROMPTS]):
        backend = loaded.fresh()
        backend.eos_token_id = eos = frequent_token(oracle, prompt)
        requests = [Request(f"p{p}-{'s' if spec else 'c'}-{m}{'-i' if ignore else ''}", prompt, MAX_TOKENS,
                            SamplingParams(min_tokens=m, ignore_eos=ignore), speculative=spec)
                    for spec in (True, False) for m, ignore in CASES]
        run(backend, requests, mode=mode, enable_batch=True)
        assert backend.num_live == 0
        for r in requests:
            assert r.output_token_ids == masked_oracle(loaded.model, prompt, eos, r.sampling), r.id
            assert eos not in r.output_token_ids
            assert len(r.output_token_ids) >= r.sampling.min_tokens
            if r.sampling.ignore_eos:
                assert (len(r.output_token_ids), r.finish_reason) == (MAX_TOKENS, FinishReason.LENGTH)
        assert any(r.served_speculatively for r in requests)
        requests_seen += requests
    # the cases bite: EOS ends some plain requests early and comes back after some minimums
    assert any(r.sampling.min_tokens == 0 and len(r.output_token_ids) < 6 for r in requests_seen)
    assert any(0 < r.sampling.min_tokens < len(r.output_token_ids) < MAX_TOKENS and not r.sampling.ignore_eos
               for r in requests_seen)


def test_a_self_drafter_proposes_exactly_what_the_target_keeps(models, loaded, prompts, oracle):
    """The drafter applies the rule at the same output indices as the target: with the target as
    its own drafter every draft inside the output is kept (an off-by-one would propose EOS)."""
    self_drafted = MlxBackend(models.target, models.target)
    proposals = record_drafts(self_drafted)
    for p, prompt in enumerate(prompts[:NUM_PROMPTS]):
        self_drafted.eos_token_id = eos = frequent_token(oracle, prompt)
        request = Request(f"p{p}", prompt, MAX_TOKENS, SamplingParams(min_tokens=13))
        run(self_drafted, [request], mode="slice")
        out = request.output_token_ids
        assert out == masked_oracle(loaded.model, prompt, eos, request.sampling)
        position = 1  # slice 0 emitted the first token
        for drafts in proposals[request.id]:
            kept = [d for i, d in enumerate(drafts) if position + i < len(out)]
            assert kept == out[position:position + len(kept)], (request.id, position)
            position += BLOCK_SIZE
