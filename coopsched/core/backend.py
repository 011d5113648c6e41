"""The model backend protocol: what the scheduler asks of a model.

Each sequence's caches live in the backend, keyed by seq_id. `last_token` is
the most recently sampled token, not yet fed to the model. The mock and MLX
backends both satisfy this; their cost (virtual or real) is theirs to pay.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .request import SamplingParams


class ModelBackend(Protocol):
    eos_token_id: int

    def prefill(self, seq_id: str, prompt: Sequence[int], params: SamplingParams,
                with_draft: bool) -> int:
        """Fill the target (and drafter) caches with the prompt; return the first token."""

    def decode(self, rows: Sequence[tuple[str, int]]) -> list[int]:
        """One batched forward over (seq_id, last_token) rows; the next token of each."""

    def draft(self, rows: Sequence[tuple[str, int]], num_tokens: int) -> list[list[int]]:
        """The drafter's `num_tokens` proposals after each row's last token."""

    def verify(self, rows: Sequence[tuple[str, int, Sequence[int]]]) -> list[list[int]]:
        """One target forward over [last, *drafts] per row: len(drafts) + 1 target tokens each."""

    def fused(self, decode_rows: Sequence[tuple[str, int]],
              verify_rows: Sequence[tuple[str, int, Sequence[int]]]) -> tuple[list[int], list[list[int]]]:
        """`decode` and `verify` in ONE forward (per-row lengths, per-row rollback): both results."""

    def rewind(self, seq_id: str, num_tokens: int) -> None:
        """Drop the last `num_tokens` positions of the target cache (a rejected draft tail)."""

    def release(self, seq_id: str) -> None:
        """Free every cache of the sequence."""

    def detokenize(self, token_ids: Sequence[int]) -> str:
        """Text of the tokens (used for stop strings)."""
