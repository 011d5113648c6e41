"""The OpenAI wire format: request validation into `CompletionParams`, errors, response bodies.

Validation is by hand so every refusal names its field (`param`) and a stable
`code`; the HTTP status comes with the ApiError, and the error `type` is the one
OpenAI sends for that status. Unknown fields are ignored, as most OpenAI-compatible
servers do; vLLM's `min_tokens` and `ignore_eos` are honoured.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

DEFAULT_MAX_TOKENS = 16         # the completions API default
DEFAULT_CHAT_MAX_TOKENS = 256   # chat has no default in OpenAI's API; the mock would run to the context
MAX_STOP_STRINGS = 4


def openai_error_type(status: int) -> str:
    """OpenAI's error type for a status: rate limits are typed by what ran out (here: requests),
    every other client error (unknown model or route included) is an invalid request."""
    if status == 429:
        return "requests"
    return "invalid_request_error" if status < 500 else "server_error"


class ApiError(Exception):
    """A refusal with its OpenAI-shaped body; `param` and `code` are null where nothing applies."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = openai_error_type(status)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


@dataclass
class CompletionParams:
    is_chat: bool
    prompt_token_ids: list[int]
    max_tokens: int
    max_tokens_given: bool
    temperature: float
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    speculative: bool = True
    return_token_ids: bool = False
    return_tick_times: bool = False
    model: str | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    extra: dict = field(default_factory=dict)


def parse_json(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}",
                       code="invalid_type")
    return body


def _type_error(param: str, want: str, value) -> ApiError:
    return ApiError(400, f"'{param}' must be {want}, got {json.dumps(value)[:80]}", param=param,
                    code="invalid_type")


def _opt(body: dict, name: str, kind: type | tuple, want: str, default=None):
    value = body.get(name)
    if value is None:
        return default
    # bool is an int in Python; JSON true is never a number here
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise _type_error(name, want, value)
    if kind is int and _is_integral(value):  # JSON has one number type: 22.0 is the integer 22
        return int(value)
    if not isinstance(value, kind):
        raise _type_error(name, want, value)
    return value


def _is_integral(value) -> bool:
    return isinstance(value, float) and value.is_integer()


def _parse_stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise _type_error("stop", "a string or a list of strings", stop)
    if len(stop) > MAX_STOP_STRINGS:
        raise ApiError(400, f"'stop' holds {len(stop)} strings; at most {MAX_STOP_STRINGS} are allowed",
                       param="stop", code="invalid_value")
    if any(s == "" for s in stop):
        raise ApiError(400, "'stop' strings must not be empty", param="stop", code="invalid_value")
    return tuple(stop)


def parse_prompt(value, encode: Callable[[str], list[int]], vocab_size: int) -> list[int]:
    """A prompt as text, a list of token ids, or a one-element list of either."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, list):
        value = [int(t) if _is_integral(t) else t for t in value]
    if isinstance(value, str):
        ids = encode(value)
    elif isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        bad = [t for t in value if not 0 <= t < vocab_size]
        if bad:
            raise ApiError(400, f"'prompt' token id {bad[0]} is outside the vocabulary [0, {vocab_size})",
                           param="prompt", code="invalid_value")
        ids = list(value)
    elif isinstance(value, list) and value and all(isinstance(p, (str, list)) for p in value):
        raise ApiError(400, f"'prompt' holds {len(value)} prompts; this server takes one per request",
                       param="prompt", code="invalid_value")
    else:
        raise _type_error("prompt", "a string or a list of token ids", value)
    if not ids:
        raise ApiError(400, "'prompt' is empty; send at least one token", param="prompt",
                       code="invalid_value")
    return ids


def parse_messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise _type_error("messages", "a non-empty list of messages", value)
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _type_error(f"messages[{i}]", "an object with a string 'role'", message)
        content = message.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            if not all(isinstance(p, dict) for p in content):
                raise _type_error(f"messages[{i}].content", "a string or a list of content parts", content)
            content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
        if content is not None and not isinstance(content, str):
            raise _type_error(f"messages[{i}].content", "a string or a list of content parts", content)
        out.append({"role": message["role"], "content": content or ""})
    return out


def parse_request(body: dict, *, is_chat: bool, encode: Callable[[str], list[int]],
                  encode_chat: Callable[[list[dict]], list[int]], vocab_size: int,
                  context_tokens: int) -> CompletionParams:
    """Validate one request body; raises ApiError(400) naming the offending field."""
    model = _opt(body, "model", str, "a string")
    if is_chat:
        if "messages" not in body:
            raise ApiError(400, "'messages' is required", param="messages", code="missing_required_parameter")
        prompt = encode_chat(parse_messages(body["messages"]))
        if not prompt:
            raise ApiError(400, "the messages encode to an empty prompt", param="messages",
                           code="invalid_value")
    else:
        if "prompt" not in body:
            raise ApiError(400, "'prompt' is required", param="prompt", code="missing_required_parameter")
        prompt = parse_prompt(body["prompt"], encode, vocab_size)
    name = "max_completion_tokens" if is_chat and body.get("max_completion_tokens") is not None \
        else "max_tokens"
    max_tokens = _opt(body, name, int, "an integer")
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(400, f"'{name}' is {max_tokens}; it must be at least 1", param=name,
                       code="invalid_value")
    temperature = _opt(body, "temperature", (int, float), "a number", 1.0)
    if temperature < 0:
        raise ApiError(400, f"'temperature' is {temperature}; it must be >= 0", param="temperature",
                       code="invalid_value")
    n = _opt(body, "n", int, "an integer", 1)
    if n != 1:
        raise ApiError(400, f"'n' is {n}; this server returns exactly one choice", param="n",
                       code="invalid_value")
    stream = _opt(body, "stream", bool, "a boolean", False)
    options = _opt(body, "stream_options", dict, "an object", {})
    include_usage = options.get("include_usage") or False
    if not isinstance(include_usage, bool):
        raise _type_error("stream_options.include_usage", "a boolean", include_usage)
    if len(prompt) >= context_tokens:
        raise ApiError(400, f"the prompt has {_tokens(len(prompt))}; this model's context is "
                            f"{context_tokens} tokens (prompt + max_tokens must fit)",
                       param="messages" if is_chat else "prompt", code="context_length_exceeded")
    max_tokens_given = max_tokens is not None
    if max_tokens is None:
        default = DEFAULT_CHAT_MAX_TOKENS if is_chat else DEFAULT_MAX_TOKENS
        max_tokens = min(default, context_tokens - len(prompt))
    elif len(prompt) + max_tokens > context_tokens:
        raise ApiError(400, f"the prompt has {_tokens(len(prompt))} and '{name}' asks for {max_tokens}; "
                            f"this model's context is {context_tokens} tokens",
                       param=name, code="context_length_exceeded")
    min_tokens = _parse_min_tokens(body, name, max_tokens, max_tokens_given)
    return CompletionParams(
        is_chat=is_chat, prompt_token_ids=prompt, max_tokens=max_tokens, max_tokens_given=max_tokens_given,
        temperature=float(temperature), stop=_parse_stop(body),
        seed=_opt(body, "seed", int, "an integer"), stream=stream, include_usage=include_usage,
        speculative=_opt(body, "speculative", bool, "a boolean", True),
        return_token_ids=_opt(body, "return_token_ids", bool, "a boolean", False),
        return_tick_times=_opt(body, "return_tick_times", bool, "a boolean", False), model=model,
        min_tokens=min_tokens, ignore_eos=_opt(body, "ignore_eos", bool, "a boolean", False))


def _parse_min_tokens(body: dict, max_name: str, max_tokens: int, max_tokens_given: bool) -> int:
    """vLLM's extension: EOS may not end the output before this many tokens (0: no minimum)."""
    min_tokens = _opt(body, "min_tokens", int, "an integer", 0)
    if min_tokens < 0:
        raise ApiError(400, f"'min_tokens' is {min_tokens}; it must be >= 0", param="min_tokens",
                       code="invalid_value")
    if min_tokens > max_tokens:
        given = "" if max_tokens_given else " (the default here; send it to raise it)"
        raise ApiError(400, f"'min_tokens' is {min_tokens} but '{max_name}' is {max_tokens}{given}; "
                            f"min_tokens must be <= {max_name}", param="min_tokens", code="invalid_value")
    return min_tokens


# -- response bodies -------------------------------------------------------------
@dataclass
class Envelope:
    """What every chunk of one response shares."""
    id: str
    model: str
    is_chat: bool
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def object(self) -> str:
        return "chat.completion.chunk" if self.is_chat else "text_completion"

    def chunk(self, choice: dict | None, **extra) -> dict:
        out = {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
               "choices": [] if choice is None else [choice]}
        out.update(extra)
        return out

    def role_choice(self, with_token_ids: bool) -> dict:
        """A chat stream's first chunk, as OpenAI sends it: the role, empty content, no token."""
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None}
        return {**choice, "token_ids": []} if with_token_ids else choice

    def token_choice(self, text: str, token_ids: Sequence[int] | None, finish_reason: str | None) -> dict:
        if self.is_chat:
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if token_ids is not None:
            choice["token_ids"] = list(token_ids)
        return choice

    def final(self, text: str, finish_reason: str | None, usage: dict,
              token_ids: Sequence[int] | None, prompt_token_ids: Sequence[int] | None, **extra) -> dict:
        if self.is_chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        if token_ids is not None:
            choice["token_ids"] = list(token_ids)
            choice["prompt_token_ids"] = list(prompt_token_ids or ())
        return {"id": self.id, "object": "chat.completion" if self.is_chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": usage, **extra}


def spec_counts(burst: dict | None) -> tuple[int, int, int]:
    """(rounds, draft tokens, accepted) as upstream counts them: K draft tokens per round and, per
    round, the tokens it emitted minus one (a request's first token comes from its slice 0)."""
    if not burst:
        return 0, 0, 0
    rounds = burst["rounds"]
    draft_n = burst["drafted_tokens"] + rounds  # K - 1 drafted per round, K counted
    accepted = burst["tokens_generated"] - 1 - rounds if rounds else 0
    return rounds, draft_n, min(max(accepted, 0), draft_n)


def timings(num_prompt: int, prompt_ms: float, num_predicted: int, predicted_ms: float, burst: dict | None,
            draft_kind: str) -> dict:
    """llama.cpp's per-response `timings` (prompt_ms: request received -> first token), with the
    draft figures upstream adds: `draft_n = 0` and `draft_kind` "none" for a classic request."""
    rounds, draft_n, accepted = spec_counts(burst)
    return {"prompt_n": num_prompt, "prompt_ms": round(prompt_ms, 3),
            "prompt_per_second": _per_second(num_prompt, prompt_ms),
            "predicted_n": num_predicted, "predicted_ms": round(predicted_ms, 3),
            "predicted_per_second": _per_second(num_predicted, predicted_ms),
            "draft_n": draft_n, "draft_n_accepted": accepted, "draft_rounds": rounds,
            "draft_kind": draft_kind if burst else "none"}


def _per_second(n: int, ms: float) -> float | None:
    return round(n * 1e3 / ms, 3) if ms > 0 else None


def usage(num_prompt: int, num_completion: int) -> dict:
    return {"prompt_tokens": num_prompt, "completion_tokens": num_completion,
            "total_tokens": num_prompt + num_completion}


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"
