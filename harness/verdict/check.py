"""The check record and the tally of many: held, failed or skipped, and the line that says which.

`ok` is True when the check's expectation was met (a legacy-burst check may be expected to fail),
False when it was not, None when it did not run (skipped, with its reason): never True for a skip.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

PASS, FAIL = "pass", "fail"


def _rounded(x: Any) -> Any:
    return round(x, 6) if isinstance(x, float) else x


@dataclass(frozen=True)
class Check:
    """One verdict: `holds` None means skipped (`note` says why); value against limit (`bound`)."""
    name: str
    holds: bool | None
    value: Any = None
    bound: Any = None
    expect: str = PASS         # "fail": a check shown to fail on the code it guards against
    note: str = ""             # the rule, or a skip's reason
    extra: Mapping[str, Any] = field(default_factory=dict)  # more JSON keys (e.g. a stall summary)

    @classmethod
    def skip(cls, name: str, reason: str, expect: str = PASS) -> Check:
        return cls(name, None, expect=expect, note=reason)

    @property
    def skipped(self) -> bool:
        return self.holds is None

    @property
    def ok(self) -> bool | None:
        """Whether the expectation was met; None when the check did not run."""
        return None if self.holds is None else self.holds == (self.expect == PASS)

    def to_json(self) -> dict:
        """The trace's check dict: `skipped` appears only on a skipped check (so traces of runs with
        no skip keep their bytes), and a skipped check's `ok` is null."""
        if self.holds is None:
            out = {"name": self.name, "ok": None, "skipped": True, "value": None, "bound": None,
                   "expect": self.expect, "note": self.note}
        else:
            out = {"name": self.name, "ok": self.ok, "holds": self.holds, "value": _rounded(self.value),
                   "bound": _rounded(self.bound), "expect": self.expect, "note": self.note}
        return out | dict(self.extra)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Check:
        known = ("name", "ok", "skipped", "holds", "value", "bound", "expect", "note")
        holds = None if d.get("skipped") else d.get("holds", d.get("ok"))
        return cls(d["name"], holds, d.get("value"), d.get("bound"), d.get("expect", PASS), d.get("note", ""),
                   {k: v for k, v in d.items() if k not in known})


def record(name: str, holds: bool | None, value=None, bound=None, expect: str = PASS, note: str = "") -> dict:
    """A check's trace dict in one call, for code that keeps checks as JSON (the live runs)."""
    return Check(name, None if holds is None else bool(holds), value, bound, expect, note).to_json()


def state(c: Check | Mapping[str, Any]) -> str:
    """'held', 'failed' or 'skipped' of a Check or its trace dict (an older trace's skip had ok true)."""
    if isinstance(c, Check):
        return "skipped" if c.skipped else ("held" if c.ok else "failed")
    if c.get("skipped") or c.get("ok") is None:
        return "skipped"
    return "held" if c["ok"] else "failed"


@dataclass(frozen=True)
class Tally:
    """What a set of labelled checks adds up to: the held, the failed and the skipped with their reasons."""
    held: int
    failed: tuple[str, ...]
    skipped: tuple[str, ...]
    reasons: tuple[tuple[str, int], ...]   # each skip reason, with how many checks it skipped

    @classmethod
    def of(cls, labelled: Iterable[tuple[str, Check | Mapping[str, Any]]]) -> Tally:
        held, failed, skipped, reasons = 0, [], [], Counter()
        for label, c in labelled:
            kind = state(c)
            if kind == "held":
                held += 1
            elif kind == "failed":
                failed.append(label)
            else:
                skipped.append(label)
                reasons[c.note if isinstance(c, Check) else (c.get("note") or "no reason given")] += 1
        return cls(held, tuple(failed), tuple(skipped), tuple(reasons.most_common()))

    @property
    def total(self) -> int:
        return self.held + len(self.failed) + len(self.skipped)

    def ok(self, strict: bool = False) -> bool:
        """Nothing failed (and, strict, nothing was skipped)."""
        return not self.failed and not (strict and self.skipped)

    def why_skipped(self) -> str:
        if len(self.reasons) == 1:
            return self.reasons[0][0]
        return "; ".join(f"{n}: {reason}" for reason, n in self.reasons)

    def line(self, runs: int | None = None) -> str:
        """'all N expectations hold ...' only when nothing failed or was skipped; else 'N hold, M skipped
        (why)' and, first, what failed."""
        across = "" if runs is None else f" across {runs} run{'' if runs == 1 else 's'}"
        if not self.failed and not self.skipped:
            return f"all {self.held} expectations hold{across}"
        parts = [f"{len(self.failed)} failed"] if self.failed else []
        parts.append(f"{self.held} hold")
        if self.skipped:
            parts.append(f"{len(self.skipped)} skipped ({self.why_skipped()})")
        return ", ".join(parts) + across
