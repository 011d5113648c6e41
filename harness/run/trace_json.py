"""The trace JSON, streamed: the same bytes as `json.dumps(traces, indent=1) + "\\n"`, written in pieces.

The standard library's encoder is pure Python whenever it indents, and builds the
whole text before returning it; a day of traffic has millions of tokens. Lists of
numbers (token ids, token times: nearly all of a trace) are written with one join
each, everything else goes through `json.dumps` piece by piece, and nothing holds
the whole text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from json.encoder import encode_basestring_ascii as _string
from typing import IO, Any

_PLAIN = (int, float)
_STREAM_DEPTH = 3  # containers this shallow are written item by item; deeper ones as one string


def write(traces: list[dict], fp: IO[str]) -> None:
    for piece in _pieces(traces, 0):
        fp.write(piece)
    fp.write("\n")


def dumps(traces: list[dict]) -> str:
    return "".join(_pieces(traces, 0)) + "\n"


def _pieces(value: Any, depth: int) -> Iterator[str]:
    if depth >= _STREAM_DEPTH or not isinstance(value, (dict, list, tuple)) or not value:
        yield _render(value, depth)
        return
    inner = "\n" + " " * (depth + 1)
    items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
    opening = "{" if isinstance(value, dict) else "["
    for i, (key, item) in enumerate(items):
        yield (opening if i == 0 else ",") + inner + ("" if key is None else _string(str(key)) + ": ")
        yield from _pieces(item, depth + 1)
    yield "\n" + " " * depth + ("}" if isinstance(value, dict) else "]")


def _render(value: Any, depth: int) -> str:
    kind = type(value)
    if kind is str:
        return _string(value)
    if kind is int or kind is float:
        return _number(value)
    if kind is dict or kind is list or kind is tuple:
        if not value:
            return "{}" if kind is dict else "[]"
        inner = "\n" + " " * (depth + 1)
        if kind is dict:
            body = ("," + inner).join(_string(str(k)) + ": " + _render(v, depth + 1) for k, v in value.items())
            return "{" + inner + body + "\n" + " " * depth + "}"
        if all(type(v) in _PLAIN for v in value):  # bool is not plain here: json spells it true/false
            body = ("," + inner).join(map(_number, value))
        else:
            body = ("," + inner).join(_render(v, depth + 1) for v in value)
        return "[" + inner + body + "\n" + " " * depth + "]"
    return json.dumps(value)  # None, bools, enums


def _number(value: int | float) -> str:
    if type(value) is int or value - value == 0:  # finite
        return repr(value)
    return json.dumps(value)  # NaN, Infinity, as the standard encoder writes them
