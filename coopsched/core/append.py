"""Appending sampled tokens to a request: the same stop rules for classic and speculative rows.

Tokens are cut to the remaining budget; EOS is never appended; stop string > EOS (`stop`) >
budget (`length`). As in vLLM no stop string ends a request before `min_tokens`, and a stop
string counts when it ends in the text the newest token added.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .request import Request, RequestState
from .types import FinishReason


class Vocab(Protocol):
    """What the stop rules need of the model (every backend has both)."""
    eos_token_id: int

    def detokenize(self, token_ids: Sequence[int]) -> str: ...


def matches_stop(request: Request, vocab: Vocab) -> bool:
    """Whether a stop string ends in the text the newest token added (each token is >= 1 char)."""
    if not request.stop:
        return False
    window = max(len(s) for s in request.stop) + 4
    tail = vocab.detokenize(request.output_token_ids[-window:])
    added = len(tail) - len(vocab.detokenize(request.output_token_ids[-window:-1]))
    return any(tail.find(s, max(len(tail) - added - len(s) + 1, 0)) != -1 for s in request.stop)


def append_tokens(request: Request, tokens: Sequence[int], vocab: Vocab) -> tuple[list[int], FinishReason | None]:
    """Append what may be appended of `tokens`; return it and the finish reason, if any."""
    output, eos_token_id = request.output_token_ids, vocab.eos_token_id
    appended: list[int] = []
    for token in tokens[: max(request.max_tokens - len(output), 0)]:
        if token == eos_token_id:
            return appended, FinishReason.STOP
        output.append(token)
        appended.append(token)
        if request.stop and len(output) >= request.sampling.min_tokens and matches_stop(request, vocab):
            return appended, FinishReason.STOP
    if len(output) >= request.max_tokens:
        return appended, FinishReason.LENGTH
    if appended:
        request.last_token = appended[-1]
    return appended, None


def append(request: Request, tokens: Sequence[int], vocab: Vocab) -> tuple[tuple[int, ...], FinishReason | None]:
    """Append tokens to a row and finish it when a rule says so."""
    appended, reason = append_tokens(request, tokens, vocab)
    if reason is not None:
        request.state = RequestState.FINISHED
        request.finish_reason = reason
    return tuple(appended), reason
