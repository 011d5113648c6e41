"""The reference oracle: the exact tokens and finish reason a server must produce for a request
on the mock target, written out from the rules (not from the scheduler's or the backend's code),
so the simulation, the state machine and the property tests all judge outputs by one rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from coopsched.core import FinishReason, Request

from .model import MockTarget, context_hash, extend_hash
from .tokenizer import ByteTokenizer

Detokenize = Callable[[Sequence[int]], str]
BYTES = ByteTokenizer().decode  # the mock's own tokenizer


class Expected(NamedTuple):
    token_ids: list[int]
    finish_reason: FinishReason


def expected(target: MockTarget, request: Request, detokenize: Detokenize = BYTES) -> Expected:
    """The target alone, token by token (vLLM's rules):
    - EOS is masked while fewer than `min_tokens` tokens are out, and always with `ignore_eos`
      (the target then picks its runner-up); an EOS that is sampled ends the request (`stop`)
      and is not part of the output;
    - a stop string ends it (`stop`, the string kept) when it ends in the text the newest token
      added and at least `min_tokens` tokens are out: one that ended earlier never counts;
    - otherwise `max_tokens` ends it (`length`); a stop string on the last token wins over length.
    """
    prompt, sampling, stop = list(request.prompt_token_ids), request.sampling, request.stop
    context, h, out, text = list(prompt), context_hash(prompt), [], ""
    while len(out) < request.max_tokens:
        masked = sampling.ignore_eos or len(out) < sampling.min_tokens
        token = target.next_token(context, h, len(prompt), sampling.temperature, sampling.seed, masked)
        if token == target.eos_token_id:
            return Expected(out, FinishReason.STOP)
        out.append(token)
        context.append(token)
        h = extend_hash(h, token)
        if stop:  # the whole output's text; the newest token added what lies past `before`
            before, text = len(text), detokenize(out)
            if len(out) >= sampling.min_tokens and any(text.find(s, max(before - len(s) + 1, 0)) != -1
                                                       for s in stop):
                return Expected(out, FinishReason.STOP)
    return Expected(out, FinishReason.LENGTH)
