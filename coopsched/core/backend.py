"""The model backend protocol: what the scheduler asks of a model.

Each sequence's caches live in the backend, keyed by seq_id. `last_token` is
the most recently sampled token, not yet fed to the model. The mock and MLX
backends both satisfy this; their cost (virtual or real) is theirs to pay.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from .request import SamplingParams


class PrefillRow(NamedTuple):
    """One row of `prefill_batch`: positions [start, stop) of the sequence's prompt.

    start = 0 creates the sequence's caches; a later row continues them (the caches hold
    exactly `start` prompt tokens). The row whose stop ends the prompt samples the first token.
    """
    seq_id: str
    prompt: Sequence[int]     # the whole prompt
    start: int
    stop: int
    params: SamplingParams
    with_draft: bool          # the drafter reads the same span

    @property
    def is_last(self) -> bool:
        return self.stop == len(self.prompt)


class ModelBackend(Protocol):
    eos_token_id: int

    @property
    def num_live(self) -> int:
        """Sequences whose caches are held (prefilled and not yet released): 0 once every request ended."""

    def prefill(self, seq_id: str, prompt: Sequence[int], params: SamplingParams,
                with_draft: bool, shared: bool = False) -> int:
        """Fill the target (and drafter) caches with the prompt; return the first token. `shared`:
        the tick's decode or verify rows run in the same forward (a cost model may price it so)."""

    def prefill_batch(self, rows: Sequence[PrefillRow], shared: bool = False) -> list[int | None]:
        """ONE forward over every row's span (whole prompts or chunks); each row's first token
        if its span ends its prompt, else None. A failure leaves every row as it was."""

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
