"""The request and error bodies in the app's OpenAPI schema, so fuzzers know the API's shape.

The handlers validate by hand (protocol.py); this schema describes what they accept
(the served model's vocabulary and context included) and the OpenAI error object
every refusal carries, so a schema-driven fuzzer (schemathesis) can check both.
"""

from __future__ import annotations

ERROR_TYPES = ("invalid_request_error", "requests", "server_error")  # OpenAI's, by status: 4xx, 429, 5xx
ERROR = {
    "type": "object", "required": ["error"], "additionalProperties": False,
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"], "additionalProperties": False,
        "properties": {"message": {"type": "string", "minLength": 1}, "type": {"enum": list(ERROR_TYPES)},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}
SSE_EVENT = {"type": "object", "required": ["data"],  # one token chunk, an error object, or [DONE]
             "properties": {"data": {"type": "string", "minLength": 1}}}
ERROR_STATUSES = {"400": "invalid request", "404": "unknown model", "413": "body too large",
                  "429": "queue full", "503": "engine stopped"}


def _common(max_tokens_name: str, context_tokens: int, model_names: list[str]) -> dict:
    stop = {"type": "string", "minLength": 1}
    return {
        "model": {"type": "string", "enum": model_names},
        max_tokens_name: {"type": "integer", "minimum": 1, "maximum": context_tokens},
        "temperature": {"type": "number", "minimum": 0},
        "stop": {"anyOf": [stop, {"type": "array", "items": stop, "maxItems": 4}]},
        "seed": {"type": "integer"},
        "n": {"type": "integer", "enum": [1]},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
        "speculative": {"type": "boolean", "description": "extension: false opts out of speculation"},
        "return_token_ids": {"type": "boolean", "description": "extension: token ids in each choice"},
        "return_tick_times": {"type": "boolean",
                              "description": "extension: each streamed event carries coopsched.tick_end_ns"},
        "min_tokens": {"type": "integer", "minimum": 0,
                       "description": "vLLM's extension: EOS is not sampled before this many tokens "
                                      "(at most max_tokens)"},
        "ignore_eos": {"type": "boolean", "description": "vLLM's extension: EOS is never sampled"},
    }


def completion_request(vocab_size: int, context_tokens: int, model_names: list[str]) -> dict:
    token_ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0,
                                                           "maximum": vocab_size - 1}}
    properties = {"prompt": {"anyOf": [{"type": "string", "minLength": 1}, token_ids]},
                  **_common("max_tokens", context_tokens, model_names)}
    return {"type": "object", "required": ["prompt"], "properties": properties}


def chat_request(context_tokens: int, model_names: list[str]) -> dict:
    part = {"type": "object", "properties": {"type": {"type": "string"}, "text": {"type": "string"}}}
    message = {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"type": "string"},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": part}]}}}
    properties = {"messages": {"type": "array", "minItems": 1, "items": message},
                  **_common("max_tokens", context_tokens, model_names),
                  "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": context_tokens}}
    return {"type": "object", "required": ["messages"], "properties": properties}


MODEL = {"type": "object", "required": ["id", "object", "created", "owned_by"],
         "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                        "owned_by": {"type": "string"}, "max_model_len": {"type": "integer"}}}


def model_responses() -> dict:
    """`responses` of GET /v1/models/{id}: the model object, or OpenAI's error for an unknown id."""
    return {200: {"description": "the model", "content": {"application/json": {"schema": MODEL}}},
            404: {"description": "unknown model", "content": {"application/json": {"schema": ERROR}}}}


def operation(body_schema: dict) -> dict:
    """`openapi_extra` of a POST route: its JSON body, its 200 (JSON or SSE) and its errors."""
    errors = {status: {"description": text, "content": {"application/json": {"schema": ERROR}}}
              for status, text in ERROR_STATUSES.items()}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": body_schema}}},
        "responses": {"200": {"description": "a completion, or an SSE stream when stream is true",
                              "content": {"application/json": {"schema": {"type": "object"}},
                                          "text/event-stream": {"schema": SSE_EVENT}}},
                      **errors},
    }
