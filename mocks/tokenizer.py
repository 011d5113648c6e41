"""A byte tokenizer: token i < 256 is byte i; ids >= 256 are specials (EOS) with no text."""

from __future__ import annotations

from collections.abc import Sequence

EOS_TOKEN_ID = 256


class ByteTokenizer:
    eos_token_id = EOS_TOKEN_ID
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int]) -> str:
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")
