"""The MLX backend's own contract: batched calls are ONE forward over all rows, and the
parity checks catch the bugs they guard against (a missing rollback, ignored padding)."""

from __future__ import annotations

import pytest
from mlx_helpers import BLOCK_SIZE, make_requests, mismatches, run

from coopsched.backends import kv_batch, mlx_backend
from coopsched.core import SamplingParams

pytestmark = pytest.mark.mlx


class CountingModel:
    """The model, counting forwards and the (batch, length) each one saw."""

    def __init__(self, model) -> None:
        self.model, self.shapes = model, []

    def __call__(self, inputs, cache=None):
        self.shapes.append(tuple(inputs.shape))
        return self.model(inputs, cache=cache)

    def __getattr__(self, name):
        return getattr(self.model, name)


def start(backend, prompts, with_draft=True):
    return [(f"s{i}", backend.prefill(f"s{i}", p, SamplingParams(), with_draft)) for i, p in enumerate(prompts)]


@pytest.mark.parametrize("layout, fused_shapes", [
    pytest.param("padded", [(8, BLOCK_SIZE)], id="padded-one-forward"),
    pytest.param("split", [(4, 1), (4, BLOCK_SIZE)], id="split-no-padding"),
])
def test_decode_verify_and_fused_are_one_forward_over_all_rows(backend, prompts, layout, fused_shapes):
    backend.fused_layout = layout
    rows = start(backend, prompts[:8])  # mixed prompt lengths: a padded batch
    backend.model = counting = CountingModel(backend.model)
    backend.decode(rows)
    assert counting.shapes == [(8, 1)]

    counting.shapes.clear()
    drafts = backend.draft(rows[:4], BLOCK_SIZE - 1)
    targets = backend.verify([(s, t, d) for (s, t), d in zip(rows[:4], drafts)])
    assert counting.shapes == [(4, BLOCK_SIZE)] and all(len(t) == BLOCK_SIZE for t in targets)

    counting.shapes.clear()
    for seq_id, _ in rows[:4]:
        backend.rewind(seq_id, BLOCK_SIZE)
    decoded, verified = backend.fused(rows[4:], [(s, t, d) for (s, t), d in zip(rows[:4], drafts)])
    assert counting.shapes == fused_shapes
    assert len(decoded) == 4 and verified == targets  # same rows, same positions: same tokens
    for seq_id, _ in rows:
        backend.release(seq_id)
    assert backend.num_live == 0


def test_parity_catches_a_missing_rollback(backend, prompts, oracle):
    backend.rewind = lambda seq_id, num_tokens: None  # keep the rejected draft tail in the cache
    requests = make_requests(prompts[:6])
    for request in requests:
        run(backend, [request])
    assert mismatches(requests, oracle, backend.eos_token_id), "a stale KV tail went unnoticed"


def test_parity_catches_ignored_padding(backend, prompts, oracle, monkeypatch):
    real_merge = kv_batch.merge

    def unpadded(caches, room):  # the padded keys stop being masked
        batch = real_merge(caches, room)
        batch.left_padding = batch.left_padding * 0
        return batch
    monkeypatch.setattr(kv_batch, "merge", unpadded)
    requests = make_requests(prompts[:8], speculative=False)
    run(backend, requests, max_batch_size=8)
    assert mismatches(requests, oracle, backend.eos_token_id), "attention over padding went unnoticed"


def test_seeded_sampling_keeps_parity_with_speculation(backend, prompts):
    def tokens(seed, speculative):
        requests = make_requests(prompts[:4], max_tokens=16, speculative=speculative)
        for r in requests:
            r.sampling = SamplingParams(temperature=0.9, seed=seed)
            run(backend, [r])
        return [r.output_token_ids for r in requests]

    assert tokens(7, True) == tokens(7, False)  # a token is keyed by (seed, position), not by path
    assert tokens(7, False) != tokens(8, False)


def test_errors_name_the_problem(backend, models, tmp_path):
    backend.prefill("x", [5, 6, 7], SamplingParams(), False)
    with pytest.raises(RuntimeError, match="already live"):
        backend.prefill("x", [5], SamplingParams(), False)
    with pytest.raises(ValueError, match="cannot rewind"):
        backend.rewind("x", 10)
    backend.release("x")
    with pytest.raises(ValueError, match="outside the model's vocab"):
        backend.prefill("z", [5, 512], SamplingParams(), False)
    assert backend.num_live == 0
    with pytest.raises(FileNotFoundError, match="coopsched model build"):
        mlx_backend.MlxBackend(tmp_path / "missing")
    no_drafter = mlx_backend.MlxBackend(models.target)
    no_drafter.prefill("y", [5, 6], SamplingParams(), True)
    with pytest.raises(RuntimeError, match="no draft model"):
        no_drafter.draft([("y", 7)], 3)
