"""Per-row KV caches batched for one forward: merge into a left-padded BatchKVCache
(padding masked, so each row's logits are what it would get alone), run, split back.

Rows keep their own caches between calls so each can be trimmed on its own.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache


class Batch:
    """Rows' per-layer caches merged into left-padded BatchKVCaches with `room` free positions.

    mlx-lm's own merge allocates exactly, so the first forward would regrow every row.
    """

    def __init__(self, caches: list[list], room: int) -> None:
        self.layers = [merge([rows[layer] for rows in caches], room) for layer in range(len(caches[0]))]

    def forward(self, model, inputs: list[list[int]]) -> mx.array:
        logits = model(mx.array(inputs), cache=self.layers)
        mx.eval(logits, [c.state for c in self.layers])
        return logits

    def split(self, num_rows: int) -> list[list]:
        out = [[layer.extract(i) for layer in self.layers] for i in range(num_rows)]
        mx.eval([c.state for rows in out for c in rows])
        return out


def new_cache(model) -> list:
    return [KVCache() for _ in model.layers]


def forward_one(model, cache: list, inputs: list[list[int]]) -> mx.array:
    logits = model(mx.array(inputs), cache=cache)
    mx.eval(logits, [c.state for c in cache])
    return logits


def merge(caches: list[KVCache], room: int) -> BatchKVCache:
    """As BatchKVCache.merge (rows right-aligned, left padding masked), plus `room` free slots."""
    lengths = [c.offset if c.keys is not None else 0 for c in caches]
    longest = max(lengths)
    padding = [longest - n for n in lengths]
    batch = BatchKVCache(padding)
    if longest == 0:
        return batch
    ref = next(c for c in caches if c.keys is not None)
    _, num_heads, _, k_dim = ref.keys.shape
    keys = mx.zeros((len(caches), num_heads, longest + room, k_dim), ref.keys.dtype)
    values = mx.zeros((len(caches), num_heads, longest + room, ref.values.shape[3]), ref.values.dtype)
    for i, (pad, c) in enumerate(zip(padding, caches)):
        if c.keys is not None:
            keys[i:i + 1, :, pad:longest] = c.keys[..., :c.offset, :]
            values[i:i + 1, :, pad:longest] = c.values[..., :c.offset, :]
    batch.keys, batch.values = keys, values
    batch.offset = batch.offset + longest
    batch._idx = longest
    return batch
