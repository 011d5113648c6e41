"""Committing sampled tokens to a request: the same rules for classic and speculative rows.

Tokens are first truncated to the remaining budget; EOS is never committed;
finish-reason ranking: stop string > EOS (`stop`) > budget (`length`). As in vLLM,
no stop string ends a request before `min_tokens`, and a stop string counts when it
ends in the text the newest token added (one that ended earlier fell before `min_tokens`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .request import Request
from .types import Emission, FinishReason

Detokenize = Callable[[Sequence[int]], str]


def matches_stop(request: Request, detokenize: Detokenize) -> bool:
    """Whether a stop string ends in the text the newest token added (each token is >= 1 char)."""
    if not request.stop:
        return False
    window = max(len(s) for s in request.stop) + 4
    tail = detokenize(request.output_token_ids[-window:])
    added = len(tail) - len(detokenize(request.output_token_ids[-window:-1]))
    return any(tail.find(s, max(len(tail) - added - len(s) + 1, 0)) != -1 for s in request.stop)


def commit_tokens(request: Request, tokens: Sequence[int], eos_token_id: int,
                  detokenize: Detokenize) -> tuple[list[int], FinishReason | None]:
    """Append what may be committed of `tokens`; return it and the finish reason, if any."""
    output = request.output_token_ids
    committed: list[int] = []
    for token in tokens[: max(request.max_tokens - len(output), 0)]:
        if token == eos_token_id:
            return committed, FinishReason.STOP
        output.append(token)
        committed.append(token)
        if request.stop and len(output) >= request.sampling.min_tokens and matches_stop(request, detokenize):
            return committed, FinishReason.STOP
    if len(output) >= request.max_tokens:
        return committed, FinishReason.LENGTH
    if committed:
        request.last_token = committed[-1]
    return committed, None


def merge_emissions(emissions: list[Emission]) -> list[Emission]:
    """One emission per request per tick: a legacy burst streams as one lump."""
    if len({e.seq_id for e in emissions}) == len(emissions):
        return emissions
    merged: dict[str, Emission] = {}
    for e in emissions:
        prev = merged.get(e.seq_id)
        merged[e.seq_id] = e if prev is None else Emission(e.seq_id, prev.token_ids + e.token_ids,
                                                             e.finish_reason or prev.finish_reason)
    return list(merged.values())
