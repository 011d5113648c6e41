"""The mock target and drafter: pure functions of the context, whatever the batch.

The target's next token is a hash of the whole context (printable ASCII), or a
scripted continuation for an exact prompt. The drafter proposes the target's
own tokens and disagrees on a schedule: a per-request script of accepted counts
per round, then a seeded per-token acceptance probability.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from .tokenizer import EOS_TOKEN_ID

_MASK = (1 << 64) - 1
_FIRST_PRINTABLE, _NUM_PRINTABLE = 32, 95


def extend_hash(h: int, token: int) -> int:
    return ((h * 1_000_003) ^ (token + 1)) & _MASK


def context_hash(tokens: Sequence[int]) -> int:
    h = 0x9E3779B97F4A7C15
    for t in tokens:
        h = extend_hash(h, t)
    return h


class MockTarget:
    def __init__(self, eos_token_id: int = EOS_TOKEN_ID, eos_rate: float = 0.0,
                 scripts: Mapping[tuple[int, ...], Sequence[int]] | None = None) -> None:
        if not 0.0 <= eos_rate <= 1.0:
            raise ValueError(f"eos_rate={eos_rate} must be within [0, 1]")
        self.eos_token_id = eos_token_id
        self.eos_rate = eos_rate
        self.scripts = {tuple(k): list(v) for k, v in (scripts or {}).items()}

    def next_token(self, context: Sequence[int], h: int, prompt_len: int,
                   temperature: float = 0.0, seed: int | None = None, suppress_eos: bool = False) -> int:
        """The token after `context` (whose hash is `h`); sampling is seeded by `seed`.

        With `suppress_eos` (min_tokens, ignore_eos) the EOS this context would get becomes the
        printable token of the same hash: a deterministic runner-up, as masking EOS's logit gives.
        """
        if self.scripts:
            script = self.scripts.get(tuple(context[:prompt_len]))
            if script is not None and len(context) - prompt_len < len(script):
                token = script[len(context) - prompt_len]
                if not (suppress_eos and token == self.eos_token_id):
                    return token
        if temperature > 0:
            h = extend_hash(h, (seed or 0) + 0x5EED)
        # splitmix64's finalizer spreads the rolling hash's bits
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _MASK
        mixed = h ^ (h >> 31)
        if self.eos_rate and not suppress_eos and (mixed >> 40) % 1_000_000 < self.eos_rate * 1_000_000:
            return self.eos_token_id
        return _FIRST_PRINTABLE + mixed % _NUM_PRINTABLE


class MockDrafter:
    def __init__(self, accept_prob: float = 0.7, seed: int = 0,
                 scripts: Mapping[str, Sequence[int]] | None = None, ignores_eos_rules: bool = False) -> None:
        if not 0.0 <= accept_prob <= 1.0:
            raise ValueError(f"accept_prob={accept_prob} must be within [0, 1]")
        self.accept_prob = accept_prob
        self.seed = seed
        self.scripts = {k: list(v) for k, v in (scripts or {}).items()}
        # a drafter that does not know min_tokens / ignore_eos proposes EOS where the target may
        # not sample it: the verify must reject it (parity only needs the target to be right)
        self.ignores_eos_rules = ignores_eos_rules
        self._rng = random.Random()  # re-seeded for every round: seeding costs less than making one

    def num_matching(self, seq_id: str, round_index: int, num_drafts: int) -> int:
        """How many of this round's drafts agree with the target before the first miss."""
        script = self.scripts.get(seq_id, ())
        if round_index < len(script):
            return min(script[round_index], num_drafts)
        rng = self._rng
        rng.seed(f"{self.seed}:{seq_id}:{round_index}")
        matched = 0
        while matched < num_drafts and rng.random() < self.accept_prob:
            matched += 1
        return matched

    @staticmethod
    def miss(target_token: int) -> int:
        """A printable token that differs from the target's."""
        return _FIRST_PRINTABLE + (max(target_token - _FIRST_PRINTABLE, 0) + 1) % _NUM_PRINTABLE
