"""Replay files: coopsched's own JSONL and the public trace formats (Azure, Mooncake, BurstGPT).

One table says where each public format keeps a request's time, prompt and output lengths;
one reader walks CSV rows or JSON lines through it. Public formats' arrivals are relative to
the earliest request; rows that generated nothing (BurstGPT's failed requests) or had an empty
prompt are left out and counted in a note. Errors name FILE:LINE, the value and what is accepted.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

FORMATS = ("auto", "coopsched", "azure", "mooncake", "burstgpt")
JSONL_KEYS = ("arrival_ms", "prompt_len", "prompt", "max_tokens", "speculative", "hash_ids")


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names FILE:LINE and the value."""


@dataclass(frozen=True)
class TraceLine:
    arrival_ms: float
    prompt_len: int | None
    prompt: str | None
    max_tokens: int | None
    speculative: bool | None          # None: the line does not say (speculative_share decides)
    hash_ids: tuple[int, ...] | None = None  # Mooncake's prefix-block hashes, kept for a prefix cache


def _datetime_us(text: str) -> int:
    """An ISO date-time (fractional seconds, optional offset) as microseconds since the epoch (UTC)."""
    when = dt.datetime.fromisoformat(text.strip())
    if when.tzinfo is not None:
        when = when.astimezone(dt.UTC).replace(tzinfo=None)
    return (when - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1)


def _seconds_us(text) -> int:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return round(value * 1e6)


def _ms_us(value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(value)
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(value)
    return round(value * 1e3)


@dataclass(frozen=True)
class Public:
    """Where one public format keeps a request: its columns (CSV) or keys (JSONL)."""
    name: str
    kind: str                       # "csv" | "jsonl"
    time: str
    time_us: Callable               # the cell -> microseconds
    time_wants: str
    prompt: str
    output: str
    left_out: str                   # what a row with 0 output tokens is, for the note
    hash_ids: str | None = None


PUBLIC = {
    "azure": Public("azure", "csv", "TIMESTAMP", _datetime_us, "a date-time such as 2023-11-16 18:15:46.6805900",
                    "ContextTokens", "GeneratedTokens", "requests that generated no tokens"),
    "mooncake": Public("mooncake", "jsonl", "timestamp", _ms_us, "a number of ms", "input_length", "output_length",
                       "requests that generated no tokens", hash_ids="hash_ids"),
    "burstgpt": Public("burstgpt", "csv", "Timestamp", _seconds_us, "a number of seconds", "Request tokens",
                       "Response tokens", "failed requests (0 response tokens)"),
}


@dataclass(frozen=True)
class Trace:
    lines: tuple[TraceLine, ...]    # in arrival order (file order among ties)
    format: str
    notes: tuple[str, ...] = ()


def sniff(path: Path, text: str) -> str:
    """The format from the first non-blank line: a JSON object's keys, or a CSV header's columns."""
    first = next((line for line in text.splitlines() if line.strip()), None)
    if first is None:
        raise TraceError(f"trace file {path} holds no requests")
    if first.lstrip().startswith(("{", "[")):  # JSON lines; the reader names a broken or non-object line
        try:
            obj = json.loads(first)
        except json.JSONDecodeError:
            return "coopsched"
        return "mooncake" if isinstance(obj, dict) and {"timestamp", "input_length"} <= set(obj) else "coopsched"
    header = {cell.strip() for cell in next(csv.reader([first]), [])}
    for fmt in PUBLIC.values():
        if fmt.kind == "csv" and {fmt.time, fmt.prompt, fmt.output} <= header:
            return fmt.name
    raise TraceError(f"{path}:1: cannot tell the trace format from {first.strip()[:80]!r}; accepted: coopsched JSONL "
                     "(arrival_ms, ...), Azure CSV (TIMESTAMP,ContextTokens,GeneratedTokens), Mooncake JSONL "
                     "(timestamp, input_length, output_length), BurstGPT CSV (Timestamp,...,Request tokens,"
                     "Response tokens,...); or set trace_format")


def read(path: Path, text: str, fmt: str = "auto") -> Trace:
    text = text.removeprefix("\ufeff")  # a CSV saved with a byte-order mark
    fmt = sniff(path, text) if fmt == "auto" else fmt
    if fmt == "coopsched":
        lines, notes = [_coopsched_line(path, number, obj) for number, obj in _json_lines(path, text)], []
    else:
        lines, notes = _public(path, text, PUBLIC[fmt])
    if not lines:
        raise TraceError(f"trace file {path} holds no requests" + (f" ({notes[0]})" if notes else ""))
    return Trace(tuple(sorted(lines, key=lambda line: line.arrival_ms)), fmt, tuple(notes))


def _json_lines(path: Path, text: str) -> Iterator[tuple[int, dict]]:
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}:{number}: not a JSON object ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{path}:{number}: want a JSON object, got {line.strip()[:60]}")
        yield number, obj


def _csv_rows(path: Path, text: str, fmt: Public) -> Iterator[tuple[int, dict]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = [h.strip() for h in reader.fieldnames or ()]
    missing = [c for c in (fmt.time, fmt.prompt, fmt.output) if c not in header]
    if missing:
        raise TraceError(f"{path}:1: a {fmt.name} CSV needs the columns {fmt.time}, {fmt.prompt}, {fmt.output}; "
                         f"the header has {', '.join(header) or 'nothing'}")
    reader.fieldnames = header
    for row in reader:
        if None in row or any(v is None for v in row.values()):
            raise TraceError(f"{path}:{reader.line_num}: want {len(header)} cells ({', '.join(header)}), "
                             f"got {len([v for v in row.values() if v is not None]) + len(row.get(None) or [])}")
        yield reader.line_num, row


def _count(where: str, key: str, value, least: int) -> int:
    text = value.strip() if isinstance(value, str) else value
    try:
        number = int(text) if isinstance(text, str) else text
    except ValueError:
        number = None
    if not isinstance(number, int) or isinstance(number, bool) or number < least:
        raise TraceError(f"{where}: {key} = {json.dumps(value)}: want a whole number >= {least}")
    return number


def _public(path: Path, text: str, fmt: Public) -> tuple[list[TraceLine], list[str]]:
    rows = _csv_rows(path, text, fmt) if fmt.kind == "csv" else _json_lines(path, text)
    kept: list[tuple[int, TraceLine]] = []
    left_out = empty = 0
    for number, row in rows:
        where = f"{path}:{number}"
        try:
            us = fmt.time_us(row[fmt.time])
        except (KeyError, ValueError, TypeError):
            raise TraceError(f"{where}: {fmt.time} = {json.dumps(row.get(fmt.time))}: want {fmt.time_wants}") from None
        output = _count(where, fmt.output, row.get(fmt.output), 0)
        if output == 0:
            left_out += 1
            continue
        prompt = _count(where, fmt.prompt, row.get(fmt.prompt), 0)
        if prompt == 0:
            empty += 1
            continue
        hashes = _hash_ids(where, row.get(fmt.hash_ids)) if fmt.hash_ids else None
        kept.append((us, TraceLine(0.0, prompt, None, output, None, hashes)))
    origin = min((us for us, _ in kept), default=0)
    lines = [replace(line, arrival_ms=round((us - origin) / 1e3, 6)) for us, line in kept]
    notes = [f"{path}: {count} {what} left out" for count, what in
             ((left_out, fmt.left_out), (empty, "requests with an empty prompt")) if count]
    return lines, notes


def _hash_ids(where: str, value) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise TraceError(f"{where}: hash_ids = {json.dumps(value)[:60]}: want a list of integers")
    return tuple(value)


def _coopsched_line(path: Path, number: int, obj: dict) -> TraceLine:
    """One line of coopsched's own JSONL: its arrival_ms is kept as written (not shifted)."""
    where = f"{path}:{number}"
    unknown = sorted(set(obj) - set(JSONL_KEYS))
    if unknown:
        raise TraceError(f"{where}: unknown key {', '.join(map(repr, unknown))}; accepted: {', '.join(JSONL_KEYS)}")
    arrival = obj.get("arrival_ms")
    if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) or not math.isfinite(arrival) or arrival < 0:
        raise TraceError(f"{where}: arrival_ms = {json.dumps(arrival)}: want a number >= 0 (required)")
    if ("prompt_len" in obj) == ("prompt" in obj):
        raise TraceError(f"{where}: give exactly one of prompt_len (int >= 1) and prompt (text)")
    prompt_len, prompt = obj.get("prompt_len"), obj.get("prompt")
    if "prompt_len" in obj and (not isinstance(prompt_len, int) or isinstance(prompt_len, bool) or prompt_len < 1):
        raise TraceError(f"{where}: prompt_len = {json.dumps(prompt_len)}: want an int >= 1")
    if "prompt" in obj and (not isinstance(prompt, str) or not prompt):
        raise TraceError(f"{where}: prompt = {json.dumps(prompt)}: want non-empty text")
    max_tokens = obj.get("max_tokens")
    if "max_tokens" in obj and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise TraceError(f"{where}: max_tokens = {json.dumps(max_tokens)}: want an int >= 1")
    speculative = obj.get("speculative")
    if "speculative" in obj and not isinstance(speculative, bool):
        raise TraceError(f"{where}: speculative = {json.dumps(speculative)}: want true or false")
    return TraceLine(float(arrival), prompt_len, prompt, max_tokens, speculative, _hash_ids(where, obj.get("hash_ids")))
