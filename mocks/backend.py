"""The mock backend: the ModelBackend protocol over MockTarget and MockDrafter.

Each call charges its cost (CostModel) to the injected clock: a ManualClock in
virtual time advances exactly, a RealClock sleeps. A call on the other path than
the last one (classic decode vs draft/verify/fused) first pays `switch_ms`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from coopsched.core.backend import PrefillRow
from coopsched.core.request import SamplingParams

from .cost import CostModel
from .model import MockDrafter, MockTarget, context_hash, extend_hash
from .tokenizer import ByteTokenizer


class ChargeableClock(Protocol):
    def sleep(self, ms: float) -> None: ...


@dataclass(slots=True)
class _Sequence:
    prompt_len: int
    params: SamplingParams
    tokens: list[int]                 # what the target cache holds
    hashes: list[int] = field(default_factory=list)  # hashes[i] = hash of tokens[:i + 1]
    rounds: int = 0


class MockBackend:
    def __init__(self, clock: ChargeableClock, cost: CostModel | None = None,
                 target: MockTarget | None = None, drafter: MockDrafter | None = None,
                 tokenizer: ByteTokenizer | None = None) -> None:
        self.clock = clock
        self.cost = cost or CostModel()
        self.target = target or MockTarget()
        self.drafter = drafter or MockDrafter()
        self.tokenizer = tokenizer or ByteTokenizer()
        self.eos_token_id = self.target.eos_token_id
        self._seqs: dict[str, _Sequence] = {}
        self._rng = random.Random(self.cost.seed)
        self._path: str | None = None  # "classic" or "spec": the last call's path (prefill has none)

    @property
    def num_live(self) -> int:
        return len(self._seqs)

    def _charge(self, ms: float, term: str | None = None, path: str | None = None) -> None:
        if path is not None:
            if self.cost.switch_ms and self._path not in (None, path):
                self.clock.sleep(self.cost.switch_ms)
            self._path = path
        self.clock.sleep(self.cost.jittered(self._rng, ms, term))

    def _push(self, seq: _Sequence, token: int) -> None:
        seq.tokens.append(token)
        seq.hashes.append(extend_hash(seq.hashes[-1], token))

    def _next(self, seq: _Sequence, context: Sequence[int], h: int, eos_rules: bool = True) -> int:
        """The target's token after `context` (whose hash is `h`): output token len(context) - prompt_len.
        Only an EOS asks whether the request may sample it yet (min_tokens, ignore_eos): if not, the
        target picks again with EOS masked (any other token is the same either way)."""
        params = seq.params
        token = self.target.next_token(context, h, seq.prompt_len, params.temperature, params.seed)
        if token == self.eos_token_id and eos_rules and params.suppresses_eos(len(context) - seq.prompt_len):
            token = self.target.next_token(context, h, seq.prompt_len, params.temperature, params.seed, True)
        return token

    # -- ModelBackend ---------------------------------------------------------
    def prefill(self, seq_id: str, prompt: Sequence[int], params: SamplingParams,
                with_draft: bool, shared: bool = False) -> int:
        seq = _Sequence(len(prompt), params, list(prompt))
        seq.hashes = [context_hash(prompt)]
        self._seqs[seq_id] = seq
        self._charge(self.cost.prefill(len(prompt), with_draft, shared), "prefill")
        return self._next(seq, seq.tokens, seq.hashes[-1])

    def decode(self, rows: Sequence[tuple[str, int]]) -> list[int]:
        self._charge(self.cost.decode(len(rows)) + self._context(rows, 1), "decode", "classic")
        return self._decode_rows(rows)

    def _context(self, rows: Sequence[tuple], positions: int | None) -> float:
        """CostModel.context over these rows as the forward starts: each row's cached tokens, once
        per position it computes (`positions`, or None: a verify row's drafts + 1)."""
        if not self.cost.context_per_token_ms:
            return 0.0
        cached = sum(len(self._seqs[row[0]].tokens) * (len(row[2]) + 1 if positions is None else positions)
                     for row in rows)
        return self.cost.context(cached)

    # -- chunked and batched prefill -------------------------------------------
    def prefill_batch(self, rows: Sequence[PrefillRow], shared: bool = False) -> list[int | None]:
        """One prefill forward over every row's span, charged `CostModel.prefill_batch`; a row's
        first token once its prompt is all in (the same context hash as a whole prefill)."""
        for row in rows:
            held = 0 if row.start == 0 else len(self._seqs[row.seq_id].tokens)
            if not 0 <= row.start == held < row.stop <= len(row.prompt):
                raise ValueError(f"prefill of {row.seq_id!r}: span [{row.start}, {row.stop}) of a "
                                 f"{len(row.prompt)}-token prompt, but its cache holds {held} tokens")
        self._charge(self.cost.prefill_batch([(r.stop - r.start, r.with_draft) for r in rows], shared))
        out: list[int | None] = []
        for row in rows:
            if row.start == 0:
                self._seqs[row.seq_id] = _Sequence(len(row.prompt), row.params, [], [context_hash(())])
            seq = self._seqs[row.seq_id]
            h = seq.hashes[-1]
            for token in row.prompt[row.start:row.stop]:
                h = extend_hash(h, token)
            seq.tokens.extend(row.prompt[row.start:row.stop])
            seq.hashes = [h]
            out.append(self._next(seq, seq.tokens, seq.hashes[-1]) if row.is_last else None)
        return out

    def _decode_rows(self, rows: Sequence[tuple[str, int]]) -> list[int]:
        out = []
        for seq_id, last in rows:
            seq = self._seqs[seq_id]
            self._push(seq, last)
            out.append(self._next(seq, seq.tokens, seq.hashes[-1]))
        return out

    def draft(self, rows: Sequence[tuple[str, int]], num_tokens: int) -> list[list[int]]:
        self._charge(self.cost.draft(num_tokens), "draft", "spec")
        out, eos_rules = [], not self.drafter.ignores_eos_rules
        for seq_id, last in rows:
            seq = self._seqs[seq_id]
            matching = self.drafter.num_matching(seq_id, seq.rounds, num_tokens)
            seq.rounds += 1
            context, h, proposals = seq.tokens + [last], extend_hash(seq.hashes[-1], last), []
            for i in range(num_tokens):
                target = self._next(seq, context, h, eos_rules)
                token = target if i < matching else self.drafter.miss(target)
                proposals.append(token)
                context.append(token)
                h = extend_hash(h, token)
            out.append(proposals)
        return out

    def verify(self, rows: Sequence[tuple[str, int, Sequence[int]]]) -> list[list[int]]:
        num_drafts = [len(d) for _, _, d in rows]
        width = sum(num_drafts) + len(rows)
        self._charge(self.cost.verify_charge(width, max(num_drafts, default=0), len(rows)) + self._context(rows, None),
                     "verify", "spec")
        return self._verify_rows(rows)

    def fused(self, decode_rows: Sequence[tuple[str, int]],
              verify_rows: Sequence[tuple[str, int, Sequence[int]]]) -> tuple[list[int], list[list[int]]]:
        """One forward over both, charged as CostModel.fused_forward prices it (by default a decode
        step of the combined width: one position per classic row + K per speculative row)."""
        widths = [len(d) + 1 for _, _, d in verify_rows]
        ms = self.cost.fused_forward(len(decode_rows), widths)
        self._charge(ms + self._context(decode_rows, 1) + self._context(verify_rows, None), "fused", "spec")
        return self._decode_rows(decode_rows), self._verify_rows(verify_rows)

    def _verify_rows(self, rows: Sequence[tuple[str, int, Sequence[int]]]) -> list[list[int]]:
        out = []
        for seq_id, last, drafts in rows:
            seq = self._seqs[seq_id]
            targets = []
            for token in [last, *drafts]:
                self._push(seq, token)
                targets.append(self._next(seq, seq.tokens, seq.hashes[-1]))
            out.append(targets)
        return out

    def rewind(self, seq_id: str, num_tokens: int) -> None:
        seq = self._seqs[seq_id]
        if num_tokens:
            del seq.tokens[-num_tokens:]
            del seq.hashes[-num_tokens:]

    def release(self, seq_id: str) -> None:
        self._seqs.pop(seq_id, None)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids)
