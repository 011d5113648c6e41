"""The MLX backend: the ModelBackend protocol over a real mlx-lm target and drafter.

Every sequence owns per-layer KV caches (target, and drafter when speculative).
A batched call merges the rows' caches into one left-padded BatchKVCache, runs
ONE forward over all rows, and splits the caches back, so each row can be
rewound on its own after a rejected draft tail. The classic decode batch stays
merged while its rows do not change. Greedy at temperature 0; where a request's
min_tokens / ignore_eos forbid EOS at an output index, its logit is -inf there
(target and drafter alike). Time is simply spent.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coopsched.core.backend import PrefillRow
from coopsched.core.request import SamplingParams

# mlx-lm takes a path that does not exist for a hub id: never let it reach the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import mlx.core as mx

from .kv_batch import Batch, forward_one, new_cache

PREFILL_STEP = 2048    # prompt chunk, as mlx_lm.generate.generate_step
RESIDENT_ROOM = 64     # decode steps a merged classic batch takes before it regrows


@dataclass(slots=True)
class _Sequence:
    params: SamplingParams
    prompt_len: int                         # a context of n tokens predicts output index n - prompt_len
    tokens: list[int]                       # what the target cache holds
    cache: list | None                      # per-layer KVCache; None while in the resident batch
    draft_tokens: list[int] = field(default_factory=list)  # what the drafter cache holds
    draft_cache: list | None = None


def load_model(model_dir: str | Path):
    """mlx_lm.load on an absolute, existing directory (a missing one would be taken for a hub id)."""
    from mlx_lm import load

    path = Path(model_dir).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a model directory (no config.json); "
                                "build one with `coopsched model build --out DIR`")
    return load(str(path))


FUSED_LAYOUTS = ("split", "padded")


class MlxBackend:
    """`fused_layout` is what a fused call computes: "split" (default) decodes the classic rows in
    their resident batch, then verifies the speculative rows, two forwards in one tick; "padded"
    runs ONE forward with every row right-padded to K. A ragged single forward (each row its own
    query length) is not possible here: an mlx-lm attention call takes one query length per batch."""

    def __init__(self, model_dir: str | Path, draft_dir: str | Path | None = None,
                 fused_layout: str = "split") -> None:
        if fused_layout not in FUSED_LAYOUTS:
            raise ValueError(f"fused_layout={fused_layout!r}: want one of {', '.join(FUSED_LAYOUTS)}")
        self.fused_layout = fused_layout
        self.model_dir = Path(model_dir).resolve()
        self.draft_dir = Path(draft_dir).resolve() if draft_dir else None
        self.model, self.tokenizer = load_model(self.model_dir)
        self.draft_model = load_model(self.draft_dir)[0] if self.draft_dir else None
        self.eos_token_id = int(self.tokenizer.eos_token_id)
        self.vocab_size = int(self.model.args.vocab_size)
        if self.draft_model is not None and int(self.draft_model.args.vocab_size) != self.vocab_size:
            raise ValueError(f"draft model {self.draft_dir} has a {self.draft_model.args.vocab_size}-token "
                             f"vocab but the target {self.model_dir} has {self.vocab_size}: they must share one")
        self._reset()

    def _reset(self) -> None:
        self._seqs: dict[str, _Sequence] = {}
        self._resident_ids: tuple[str, ...] = ()
        self._resident: Batch | None = None

    def fresh(self) -> MlxBackend:
        """A backend with no sequences that shares this one's loaded weights."""
        other = object.__new__(MlxBackend)
        for name in ("model_dir", "draft_dir", "model", "tokenizer", "draft_model", "eos_token_id", "vocab_size",
                     "fused_layout"):
            setattr(other, name, getattr(self, name))
        other._reset()
        return other

    @property
    def num_live(self) -> int:
        """Sequences holding caches (the backend's pool in use)."""
        return len(self._seqs)

    @property
    def has_drafter(self) -> bool:
        return self.draft_model is not None

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    # -- ModelBackend ---------------------------------------------------------
    def prefill(self, seq_id: str, prompt: Sequence[int], params: SamplingParams,
                with_draft: bool, shared: bool = False) -> int:  # shared: a pricing hint; MLX runs its own forward
        if seq_id in self._seqs:
            raise RuntimeError(f"sequence {seq_id!r} is already live in the MLX backend")
        if not prompt:
            raise ValueError(f"sequence {seq_id!r}: empty prompt")
        prompt = [int(t) for t in prompt]
        bad = next((t for t in prompt if not 0 <= t < self.vocab_size), None)
        if bad is not None:  # MLX would index the embedding out of bounds without a word
            raise ValueError(f"sequence {seq_id!r}: token id {bad} is outside the model's vocab "
                             f"(0..{self.vocab_size - 1})")
        seq = _Sequence(params, len(prompt), list(prompt), new_cache(self.model))
        # As generate_step: all but the last token in chunks, then the last one for the logits.
        for start in range(0, len(prompt) - 1, PREFILL_STEP):
            self.model(mx.array([prompt[start:min(start + PREFILL_STEP, len(prompt) - 1)]]),
                       cache=seq.cache)
            mx.eval([c.state for c in seq.cache])
        logits = self.model(mx.array([prompt[-1:]]), cache=seq.cache)
        if with_draft and self.draft_model is not None:
            seq.draft_cache = new_cache(self.draft_model)
            for start in range(0, len(prompt), PREFILL_STEP):
                self.draft_model(mx.array([prompt[start:start + PREFILL_STEP]]), cache=seq.draft_cache)
            seq.draft_tokens = list(prompt)
            mx.eval([c.state for c in seq.draft_cache])
        self._seqs[seq_id] = seq
        return self._sample([seq], logits[:, -1, :], [len(prompt)])[0]

    # -- chunked and batched prefill -------------------------------------------
    def prefill_batch(self, rows: Sequence[PrefillRow], shared: bool = False) -> list[int | None]:
        """Prefill spans of several rows (chunks or whole prompts) as `prefill` does one prompt,
        batched: ONE target forward over every span but the last token of a prompt that ends in it
        (shorter rows right-padded, then rolled into left padding, as `fused`; no logits computed),
        then ONE forward over those last tokens for the first tokens; the drafter reads the spans in
        a forward of its own. New rows' caches are kept only once every forward succeeded."""
        if not rows:
            return []
        seqs = [self._span_seq(row) for row in rows]
        spans = [[int(t) for t in row.prompt[row.start:row.stop]] for row in rows]
        caches = [s.cache for s in seqs]
        body = [span[:-1] if row.is_last else span for span, row in zip(spans, rows)]
        fed = [i for i, tokens in enumerate(body) if tokens]
        for i, cache in zip(fed, _fill(self.model, [caches[i] for i in fed], [body[i] for i in fed])):
            caches[i] = cache
        last = [i for i, row in enumerate(rows) if row.is_last]
        logits = None
        if last:
            logits, after = _forward_last(self.model, [caches[i] for i in last], [spans[i][-1] for i in last])
            for i, cache in zip(last, after):
                caches[i] = cache
        drafted = [i for i, row in enumerate(rows) if row.with_draft and self.draft_model is not None]
        draft_caches = _fill(self.draft_model, [seqs[i].draft_cache or new_cache(self.draft_model) for i in drafted],
                             [spans[i] for i in drafted]) if drafted else []
        for row, seq, cache, span in zip(rows, seqs, caches, spans):
            seq.cache = cache
            seq.tokens.extend(span)
            self._seqs[row.seq_id] = seq
        for i, cache in zip(drafted, draft_caches):
            if seqs[i].draft_cache is None:
                seqs[i].draft_tokens = []
            seqs[i].draft_cache = cache
            seqs[i].draft_tokens.extend(spans[i])
        out: list[int | None] = [None] * len(rows)
        if logits is not None:
            firsts = self._sample([seqs[i] for i in last], logits[:, -1, :], [len(rows[i].prompt) for i in last])
            for i, token in zip(last, firsts):
                out[i] = token
        return out

    def _span_seq(self, row: PrefillRow) -> _Sequence:
        """The sequence a prefill span continues, or a new one (registered once the call succeeds)."""
        if row.start == 0:
            if row.seq_id in self._seqs:
                raise RuntimeError(f"sequence {row.seq_id!r} is already live in the MLX backend")
            if not row.prompt:
                raise ValueError(f"sequence {row.seq_id!r}: empty prompt")
            bad = next((int(t) for t in row.prompt if not 0 <= int(t) < self.vocab_size), None)
            if bad is not None:
                raise ValueError(f"sequence {row.seq_id!r}: token id {bad} is outside the model's vocab "
                                 f"(0..{self.vocab_size - 1})")
            return _Sequence(row.params, len(row.prompt), [], new_cache(self.model))
        seq = self._own(row.seq_id)
        if len(seq.tokens) != row.start or not row.start < row.stop <= len(row.prompt):
            raise ValueError(f"prefill of {row.seq_id!r}: span [{row.start}, {row.stop}) of a {len(row.prompt)}-token "
                             f"prompt, but its cache holds {len(seq.tokens)} tokens")
        return seq

    def decode(self, rows: Sequence[tuple[str, int]]) -> list[int]:
        ids = tuple(seq_id for seq_id, _ in rows)
        inputs = [[int(last)] for _, last in rows]
        if len(rows) == 1:
            seq = self._own(ids[0])
            logits = forward_one(self.model, seq.cache, inputs)
        else:
            if ids != self._resident_ids:  # the classic batch changed: re-merge it once
                self._evict()
                self._resident = Batch([self._seqs[i].cache for i in ids], RESIDENT_ROOM)
                self._resident_ids = ids
                for seq_id in ids:
                    self._seqs[seq_id].cache = None
            logits = self._resident.forward(self.model, inputs)
        seqs = [self._seqs[i] for i in ids]
        for seq, fed in zip(seqs, inputs):
            seq.tokens.extend(fed)
        return self._sample(seqs, logits[:, -1, :], [len(s.tokens) for s in seqs])

    def draft(self, rows: Sequence[tuple[str, int]], num_tokens: int) -> list[list[int]]:
        if self.draft_model is None:
            raise RuntimeError("this MLX backend has no draft model; pass draft_dir "
                               "(or run the scheduler with has_drafter=False)")
        if num_tokens < 1:
            return [[] for _ in rows]
        seqs = [self._seqs[seq_id] for seq_id, _ in rows]
        inputs = [self._draft_unread(seq, [*seq.tokens, int(last)]) for seq, (_, last) in zip(seqs, rows)]
        if len({len(x) for x in inputs}) > 1:  # ragged catch-up: read it row by row first
            for seq, unread in zip(seqs, inputs):
                if len(unread) > 1:
                    forward_one(self.draft_model, seq.draft_cache, [unread[:-1]])
                    seq.draft_tokens.extend(unread[:-1])
            inputs = [x[-1:] for x in inputs]
        proposals: list[list[int]] = [[] for _ in rows]
        batch = Batch([s.draft_cache for s in seqs], len(inputs[0]) + num_tokens) if len(rows) > 1 else None
        for step in range(num_tokens):
            logits = (batch.forward(self.draft_model, inputs) if batch
                      else forward_one(self.draft_model, seqs[0].draft_cache, inputs))
            # the same EOS rule as the target (the verify would reject a forbidden EOS anyway)
            tokens = _greedy(self._mask_eos(seqs, logits[:, -1, :], [len(s.tokens) + 1 + step for s in seqs]))
            for seq, fed, row, token in zip(seqs, inputs, proposals, tokens):
                seq.draft_tokens.extend(fed)
                row.append(token)
            inputs = [[t] for t in tokens]
        if batch:
            for seq, cache in zip(seqs, batch.split(len(seqs))):
                seq.draft_cache = cache
        return proposals

    def verify(self, rows: Sequence[tuple[str, int, Sequence[int]]]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in rows]
        by_width: dict[int, list[int]] = {}
        for i, (_, _, drafts) in enumerate(rows):
            by_width.setdefault(len(drafts) + 1, []).append(i)
        for indices in by_width.values():  # one forward per width (the scheduler sends one width)
            seqs = [self._own(rows[i][0]) for i in indices]
            inputs = [[int(rows[i][1]), *map(int, rows[i][2])] for i in indices]
            if len(seqs) == 1:
                logits = forward_one(self.model, seqs[0].cache, inputs)
            else:
                batch = Batch([s.cache for s in seqs], len(inputs[0]))
                logits = batch.forward(self.model, inputs)
                for seq, cache in zip(seqs, batch.split(len(seqs))):
                    seq.cache = cache
            columns = [self._sample(seqs, logits[:, j, :], [len(s.tokens) + j + 1 for s in seqs])
                       for j in range(len(inputs[0]))]
            for k, (i, seq, fed) in enumerate(zip(indices, seqs, inputs)):
                seq.tokens.extend(fed)
                out[i] = [column[k] for column in columns]
        return out

    def fused(self, decode_rows: Sequence[tuple[str, int]],
              verify_rows: Sequence[tuple[str, int, Sequence[int]]]) -> tuple[list[int], list[list[int]]]:
        """`decode` and `verify` in one tick, as `fused_layout` says (the class docstring)."""
        if self.fused_layout == "split":  # no padding: each forward computes only real positions
            return (self.decode(decode_rows) if decode_rows else [],
                    self.verify(verify_rows) if verify_rows else [])
        return self._fused_padded(decode_rows, verify_rows)

    def _fused_padded(self, decode_rows: Sequence[tuple[str, int]],
                      verify_rows: Sequence[tuple[str, int, Sequence[int]]]) -> tuple[list[int], list[list[int]]]:
        """`decode` and `verify` in ONE forward: shorter rows are right-padded (causal masking
        keeps real positions from seeing the pads), then the pads are rolled into left padding."""
        ids = [seq_id for seq_id, _ in decode_rows] + [seq_id for seq_id, _, _ in verify_rows]
        inputs = [[int(last)] for _, last in decode_rows] + \
            [[int(last), *map(int, drafts)] for _, last, drafts in verify_rows]
        if not ids:
            return [], []
        seqs = [self._own(seq_id) for seq_id in ids]
        width = max(len(x) for x in inputs)
        if len(seqs) == 1:
            logits = forward_one(self.model, seqs[0].cache, inputs)
        else:
            batch = Batch([s.cache for s in seqs], width)
            for layer in batch.layers:
                layer.prepare(right_padding=[width - len(x) for x in inputs])
            logits = batch.forward(self.model, [x + [0] * (width - len(x)) for x in inputs])
            for layer in batch.layers:
                layer.finalize()
            for seq, cache in zip(seqs, batch.split(len(seqs))):
                seq.cache = cache
        columns = [self._sample(seqs, logits[:, j, :], [len(s.tokens) + j + 1 for s in seqs])
                   for j in range(width)]
        for seq, fed in zip(seqs, inputs):
            seq.tokens.extend(fed)
        decoded = [columns[0][k] for k in range(len(decode_rows))]
        verified = [[columns[j][k] for j in range(len(inputs[k]))]
                    for k in range(len(decode_rows), len(ids))]
        return decoded, verified

    def rewind(self, seq_id: str, num_tokens: int) -> None:
        if num_tokens <= 0:
            return
        seq = self._own(seq_id)
        if num_tokens > len(seq.tokens):
            raise ValueError(f"cannot rewind {seq_id!r} by {num_tokens}: its cache holds {len(seq.tokens)}")
        for c in seq.cache:
            c.trim(num_tokens)
        del seq.tokens[-num_tokens:]
        # The drafter cache is reconciled against seq.tokens at the next draft().

    def release(self, seq_id: str) -> None:
        if seq_id in self._resident_ids:
            self._evict()
        self._seqs.pop(seq_id, None)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids))

    # -- internals ------------------------------------------------------------
    def _own(self, seq_id: str) -> _Sequence:
        """The sequence, with its target cache out of the resident batch."""
        if seq_id in self._resident_ids:
            self._evict()
        return self._seqs[seq_id]

    def _evict(self) -> None:
        if self._resident is None:
            return
        for seq_id, cache in zip(self._resident_ids, self._resident.split(len(self._resident_ids))):
            self._seqs[seq_id].cache = cache
        self._resident, self._resident_ids = None, ()

    def _draft_unread(self, seq: _Sequence, context: list[int]) -> list[int]:
        """Trim the drafter cache to its longest prefix of `context` (dropping what the target
        rejected); return the rest, which the first draft step reads (always at least `last`)."""
        if seq.draft_cache is None:
            seq.draft_cache, seq.draft_tokens = new_cache(self.draft_model), []
        common, limit = 0, min(len(seq.draft_tokens), len(context) - 1)
        while common < limit and seq.draft_tokens[common] == context[common]:
            common += 1
        stale = len(seq.draft_tokens) - common
        if stale:
            for c in seq.draft_cache:
                c.trim(stale)
            del seq.draft_tokens[common:]
        return context[common:]

    def _sample(self, seqs: Sequence[_Sequence], logits: mx.array, positions: Sequence[int]) -> list[int]:
        """Greedy rows exactly as generate_step. Temperature rows draw with a key of (seed, context
        length), so a token is the same whether decoded, verified or fused: speculation keeps parity.
        `positions` are the context lengths the logits follow (output index = position - prompt_len)."""
        logits = self._mask_eos(seqs, logits, positions)
        greedy = _greedy(logits)
        out = []
        for i, seq in enumerate(seqs):
            if seq.params.temperature <= 0:
                out.append(greedy[i])
                continue
            key = mx.random.key(((seq.params.seed or 0) * 1_000_003 + positions[i]) % (1 << 63))
            token = mx.random.categorical(logits[i] / seq.params.temperature, key=key)
            out.append(int(token.item()))
        return out


    def _mask_eos(self, seqs: Sequence[_Sequence], logits: mx.array, positions: Sequence[int]) -> mx.array:
        """EOS's logit at -inf in the rows whose next output index may not be EOS, as a logits
        processor before argmax or the draw; the logits are untouched when no row needs it."""
        rows = [seq.params.suppresses_eos(pos - seq.prompt_len) for seq, pos in zip(seqs, positions)]
        if not any(rows):
            return logits
        is_eos = mx.arange(logits.shape[-1]) == self.eos_token_id
        return mx.where(mx.array(rows)[:, None] & is_eos[None, :], mx.array(-mx.inf, logits.dtype), logits)


def _fill(model, caches: list[list], inputs: list[list[int]]) -> list[list]:
    """ONE forward of rows of different lengths into their caches, as a prompt chunk of
    generate_step: only the caches are evaluated (no logits). Each row's cache after it."""
    if len(caches) == 1:
        model(mx.array(inputs), cache=caches[0])
        mx.eval([c.state for c in caches[0]])
        return caches
    width = max(len(x) for x in inputs)
    batch = Batch(caches, width)
    for layer in batch.layers:
        layer.prepare(right_padding=[width - len(x) for x in inputs])
    model(mx.array([x + [0] * (width - len(x)) for x in inputs]), cache=batch.layers)
    for layer in batch.layers:
        layer.finalize()
    return batch.split(len(caches))


def _forward_last(model, caches: list[list], tokens: list[int]) -> tuple[mx.array, list[list]]:
    """ONE forward of each row's last prompt token (a decode-shaped step): logits and caches."""
    inputs = [[t] for t in tokens]
    if len(caches) == 1:
        return forward_one(model, caches[0], inputs), caches
    batch = Batch(caches, 1)
    logits = batch.forward(model, inputs)
    return logits, batch.split(len(caches))


def _greedy(logits: mx.array) -> list[int]:
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # as generate_step
    return mx.argmax(logprobs, axis=-1).tolist()


def make_mlx_backend(model_dir: str | Path | None = None, draft_dir: str | Path | None = None,
                     cache_dir: str | Path | None = None, progress=None) -> MlxBackend:
    """The MLX backend on the given models, or on tiny models built once into the cache."""
    if model_dir is None:
        from .model_build import ensure_tiny_models

        model_dir, built_draft = ensure_tiny_models(cache_dir, progress=progress)
        draft_dir = draft_dir or built_draft
    return MlxBackend(model_dir, draft_dir)


def scenario_backend_factory(model_dir: str | Path | None = None, draft_dir: str | Path | None = None,
                             cache_dir: str | Path | None = None):
    """For the harness: `(clock, scenario, seed) -> backend`, loading the models once.

    The clock is unused: a real backend spends real time, which the engine's RealClock reads.
    """
    loaded: list[MlxBackend] = []

    def factory(_clock, _scenario, _seed) -> MlxBackend:
        if not loaded:
            loaded.append(make_mlx_backend(model_dir, draft_dir, cache_dir, progress=_log_progress))
        return loaded[0].fresh()
    return factory


def _log_progress(message: str) -> None:
    from rich.console import Console

    Console(stderr=True).log(f"tiny MLX models: {message}", highlight=False)
