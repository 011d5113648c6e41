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
_UNSIGNED = re.compile(r"\+?[0-9]+", re.ASCII)
_SIGNED = re.compile(r"[+-]?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)", re.ASCII)
DEFAULT_HOL_BUDGET_MS = SchedulerConfig.__dataclass_fields__["hol_budget_ms"].default


class GateError(ValueError):
    """A gate value that must stop the server at startup."""


@dataclass(frozen=True)
class Gate:
    name: str
    default: str
    meaning: str


GATES = (
    Gate("MLXCEL_MTP_TICK_SLICE", "on", "off-set -> legacy run-to-completion burst; else slices"),
    Gate("MLXCEL_MTP_SLICE_GRANT_ROUNDS", "8", "ASCII digits, optional '+', trimmed; 0 = no rotation; else 8"),
    Gate("MLXCEL_ENABLE_MTP_B1", "unset", "off-set forces B=1 speculation off; anything else forces it on"),
    Gate("MLXCEL_ENABLE_MTP_BATCH", "off", "only 1,true,TRUE,yes,on enable B>1 windows"),
    Gate("MLXCEL_ENABLE_MTP_BATCH_RAGGED", "off", "same set; mixed prompt lengths in a window (needs BATCH)"),
    Gate("MLXCEL_DRAFT_BLOCK_SIZE", "4", "integer K >= 2; unparseable -> warning, 4 kept; K < 2 -> startup error"),
    Gate("MLXCEL_DRAFT_KIND", "auto", "exactly auto, mtp or dflash (never sliced); else startup error"),
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
            warnings=tuple(warnings),
        )

    @classmethod
    def from_env(cls, defaults: Mapping[str, str] | None = None) -> Gates:
        """Gates from the environment; `defaults` (a scenario's own) lose to any gate that is set."""
        raw = dict(defaults or {})
        raw.update({name: os.environ[name] for name in GATE_NAMES + KNOB_NAMES if name in os.environ})
        return cls.parse(raw)

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
        )
        values.update(overrides)
        return SchedulerConfig(**values)


def parse_grant_rounds(value: str | None, default: int = 8) -> int:
    if value is None:
        return default
    text = value.strip(ASCII_WHITESPACE)
    return int(text) if _UNSIGNED.fullmatch(text) else default


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
