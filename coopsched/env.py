"""Every MLXCEL_* gate in one table, parsed as the README's "Environment gates" table says.

`Gates.parse(mapping)` is pure (tests feed it raw values); `Gates.from_env()` is
the only place in coopsched that reads os.environ. Startup errors raise GateError
naming the gate and the value; soft problems come back as `warnings`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .core.config import DRAFT_KINDS, SchedulerConfig

OFF_SET = frozenset({"0", "false", "FALSE", "no", "off"})
AFFIRMATIVE_SET = frozenset({"1", "true", "TRUE", "yes", "on"})
ASCII_WHITESPACE = " \t\n\r\x0b\x0c"
# what upstream's trim() strips: Unicode White_Space (Python's str.strip() also strips \x1c-\x1f)
UNICODE_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) \
    + "\u2028\u2029\u202f\u205f\u3000"
MIXED_ON_SET = frozenset({"1", "true", "yes", "on"})  # matched after trimming and ASCII lowercasing
_UNSIGNED = re.compile(r"\+?[0-9]+", re.ASCII)
_SIGNED = re.compile(r"[+-]?[0-9]+", re.ASCII)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)
DEFAULT_HOL_BUDGET_MS = SchedulerConfig.__dataclass_fields__["hol_budget_ms"].default
DEFAULT_GRANT_INTERVAL = 16
DEFAULT_PREFILL_CHUNK = 2048


class GateError(ValueError):
    """A gate value that must stop the server at startup."""


@dataclass(frozen=True)
class Gate:
    name: str
    default: str
    meaning: str


GATES = (
    Gate("MLXCEL_MTP_TICK_SLICE", "on", "off-set -> legacy run-to-completion burst; else slices"),
    Gate("MLXCEL_MTP_SLICE_GRANT_ROUNDS", "8", "unsigned 64-bit (Unicode whitespace trimmed, optional '+', "
         "ASCII digits); 0 = no rotation; anything else -> 8"),
    Gate("MLXCEL_ENABLE_MTP_B1", "unset", "off-set forces B=1 speculation off; anything else forces it on"),
    Gate("MLXCEL_ENABLE_MTP_BATCH", "off", "only 1,true,TRUE,yes,on enable B>1 windows"),
    Gate("MLXCEL_ENABLE_MTP_BATCH_RAGGED", "off", "same set; mixed prompt lengths in a window (needs BATCH)"),
    Gate("MLXCEL_DRAFT_BLOCK_SIZE", "4", "integer K >= 2; unparseable -> warning, 4 kept; K < 2 -> startup error"),
    Gate("MLXCEL_DRAFT_KIND", "auto", "exactly auto, mtp or dflash (never sliced); else startup error"),
    Gate("MLXCEL_PREFILL_GRANT_INTERVAL", "16", "unsigned 32-bit, Unicode whitespace trimmed: decode ticks a "
         "chunked prompt yields before one chunk is granted; 0 disables the grant; anything else -> 16 "
         "(--prefill-grant-interval wins)"),
    Gate("MLXCEL_MIXED_STEP", "off", "trimmed, ASCII-lowercased 1, true, yes or on: the chunk and the decode "
         "rows in one forward; anything else off"),
    Gate("MLXCEL_PREFILL_CHUNK", "2048", "unsigned prompt tokens per prefill tick; 0 = single pass; "
         "unparseable -> warning, 2048 kept; unset: coopsched's whole prompts (--prefill-chunk-tokens wins)"),
)
GATE_NAMES = tuple(g.name for g in GATES)
# coopsched's own knobs (beyond upstream): same parsing care, kept apart from the pinned MLXCEL_* table.
KNOBS = (
    Gate("COOPSCHED_HOL_BUDGET_MS", "50", "cost mode's HOL budget, ms: trimmed ASCII decimal > 0; "
         "unparseable -> warning, 50 kept; <= 0 -> startup error (--hol-budget-ms wins)"),
)
KNOB_NAMES = tuple(k.name for k in KNOBS)


@dataclass(frozen=True)
class Gates:
    tick_slice: bool = True
    grant_rounds: int = 8
    mtp_b1: bool | None = None   # None: unset, policy decides (on in this reference)
    mtp_batch: bool = False
    mtp_batch_ragged: bool = False
    draft_block_size: int = 4
    draft_kind: str = "auto"
    hol_budget_ms: float = DEFAULT_HOL_BUDGET_MS
    prefill_grant_interval: int = DEFAULT_GRANT_INTERVAL
    mixed_step: bool = False
    prefill_chunk: int | None = None  # None: unset (the scheduler keeps whole prompts)
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> Gates:
        warnings: list[str] = []
        return cls(
            tick_slice=raw.get("MLXCEL_MTP_TICK_SLICE") not in OFF_SET,
            grant_rounds=parse_grant_rounds(raw.get("MLXCEL_MTP_SLICE_GRANT_ROUNDS")),
            mtp_b1=None if "MLXCEL_ENABLE_MTP_B1" not in raw else raw["MLXCEL_ENABLE_MTP_B1"] not in OFF_SET,
            mtp_batch=raw.get("MLXCEL_ENABLE_MTP_BATCH") in AFFIRMATIVE_SET,
            mtp_batch_ragged=raw.get("MLXCEL_ENABLE_MTP_BATCH_RAGGED") in AFFIRMATIVE_SET,
            draft_block_size=parse_block_size(raw.get("MLXCEL_DRAFT_BLOCK_SIZE"), warnings),
            draft_kind=parse_draft_kind(raw.get("MLXCEL_DRAFT_KIND")),
            hol_budget_ms=parse_hol_budget_ms(raw.get("COOPSCHED_HOL_BUDGET_MS"), warnings),
            prefill_grant_interval=parse_grant_interval(raw.get("MLXCEL_PREFILL_GRANT_INTERVAL")),
            mixed_step=parse_mixed_step(raw.get("MLXCEL_MIXED_STEP")),
            prefill_chunk=parse_prefill_chunk(raw.get("MLXCEL_PREFILL_CHUNK"), warnings),
            warnings=tuple(warnings),
        )

    @classmethod
    def from_env(cls, defaults: Mapping[str, str] | None = None) -> Gates:
        """Gates from the environment; `defaults` (a scenario's own) lose to any gate that is set."""
        raw = dict(defaults or {})
        raw.update({name: os.environ[name] for name in GATE_NAMES + KNOB_NAMES if name in os.environ})
        return cls.parse(raw)

    @property
    def prefill_chunk_tokens(self) -> int:
        """The chunk the gate names (upstream's 2048 when unset)."""
        return DEFAULT_PREFILL_CHUNK if self.prefill_chunk is None else self.prefill_chunk

    def scheduler_config(self, **overrides) -> SchedulerConfig:
        """The SchedulerConfig these gates imply; `overrides` (e.g. mode from --mode) win."""
        values = dict(
            mode="slice" if self.tick_slice else "burst",
            grant_rounds=self.grant_rounds,
            enable_b1=True if self.mtp_b1 is None else self.mtp_b1,
            enable_batch=self.mtp_batch,
            enable_ragged=self.mtp_batch and self.mtp_batch_ragged,
            block_size=self.draft_block_size,
            draft_kind=self.draft_kind,
            hol_budget_ms=self.hol_budget_ms,
            prefill_grant_interval=self.prefill_grant_interval,
            mixed_step=self.mixed_step,
        )
        if self.prefill_chunk is not None:
            values["prefill_chunk_tokens"] = self.prefill_chunk
        values.update(overrides)
        return SchedulerConfig(**values)


def parse_unsigned(value: str, bits: int) -> int | None:
    """Upstream's unsigned integers: Unicode whitespace trimmed, an optional '+', ASCII digits,
    below 2**bits; None for anything else (empty, a sign, a decimal point, an overflow)."""
    text = value.strip(UNICODE_WHITESPACE)
    if not _UNSIGNED.fullmatch(text):
        return None
    number = int(text)
    return number if number < 2**bits else None


def parse_grant_rounds(value: str | None, default: int = 8) -> int:
    parsed = None if value is None else parse_unsigned(value, 64)
    return default if parsed is None else parsed


def parse_grant_interval(value: str | None) -> int:
    """A typo falls back to 16, never to 0: it must not silently bring back the unbounded wait."""
    parsed = None if value is None else parse_unsigned(value, 32)
    return DEFAULT_GRANT_INTERVAL if parsed is None else parsed


def parse_mixed_step(value: str | None) -> bool:
    if value is None:
        return False
    text = value.strip(UNICODE_WHITESPACE)
    return text.translate(_ASCII_LOWER) in MIXED_ON_SET


def parse_prefill_chunk(value: str | None, warnings: list[str]) -> int | None:
    if value is None:
        return None
    parsed = parse_unsigned(value, 64)
    if parsed is None:
        warnings.append(f"MLXCEL_PREFILL_CHUNK={value!r} is not an unsigned number of tokens; "
                        f"keeping {DEFAULT_PREFILL_CHUNK}")
        return DEFAULT_PREFILL_CHUNK
    return parsed


def parse_block_size(value: str | None, warnings: list[str], default: int = 4) -> int:
    if value is None:
        return default
    text = value.strip(ASCII_WHITESPACE)
    if not _SIGNED.fullmatch(text):
        warnings.append(f"MLXCEL_DRAFT_BLOCK_SIZE={value!r} is not an integer; keeping K={default}")
        return default
    k = int(text)
    if k < 2:
        raise GateError(f"MLXCEL_DRAFT_BLOCK_SIZE={value!r}: the block size K must be an integer >= 2")
    return k


def parse_draft_kind(value: str | None) -> str:
    if value is None:
        return "auto"
    if value not in DRAFT_KINDS:
        raise GateError(f"MLXCEL_DRAFT_KIND={value!r} is not one of {', '.join(DRAFT_KINDS)}")
    return value


def parse_hol_budget_ms(value: str | None, warnings: list[str],
                        default: float = DEFAULT_HOL_BUDGET_MS) -> float:
    """ASCII decimal ms after trimming (no exponent, inf, nan, '_' or non-ASCII digits)."""
    if value is None:
        return default
    text = value.strip(ASCII_WHITESPACE)
    if not _DECIMAL.fullmatch(text):
        warnings.append(f"COOPSCHED_HOL_BUDGET_MS={value!r} is not a decimal number of ms; "
                        f"keeping {default:g}")
        return default
    budget = float(text)
    if budget <= 0:
        raise GateError(f"COOPSCHED_HOL_BUDGET_MS={value!r}: the HOL budget must be > 0 ms")
    return budget
