"""A fault-injecting backend wrapper for simulation, the state machine and server tests.

`FaultyBackend` wraps any ModelBackend, logs each model call of the current tick
(kind and rows) and fires armed faults when a call includes their request:
`raise` (a BackendError naming that request), `generic` (a plain exception: the
backend cannot say for whom), `disconnect` (the client vanishes: `on_disconnect`
runs just before the call, so a disconnect before `verify` lands between draft and
verify). A persistent fault fires on every matching call (a poisoned request or a
broken drafter); `skip` lets that many matching calls through first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from coopsched.executor import BackendError

MODEL_CALLS = ("prefill", "decode", "draft", "verify", "fused")
FAULT_KINDS = ("raise", "generic", "disconnect")
ANY = "*"


@dataclass(slots=True)
class Fault:
    kind: str                 # raise | generic | disconnect
    call: str                 # prefill | decode | draft | verify
    seq_id: str = ANY         # "*": any row (a drafter that always raises)
    persistent: bool = False
    skip: int = 0             # matching calls to let through before it fires

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS or self.call not in MODEL_CALLS:
            raise ValueError(f"fault {self.kind!r} on {self.call!r}: want a kind in {FAULT_KINDS} "
                             f"and a call in {MODEL_CALLS}")

    def matches(self, call: str, seq_ids: Sequence[str]) -> bool:
        return call == self.call and (self.seq_id == ANY or self.seq_id in seq_ids)


class InjectedFault(RuntimeError):
    """The plain exception of a `generic` fault."""


class FaultyBackend:
    def __init__(self, inner, on_disconnect: Callable[[str], object] | None = None) -> None:
        self.inner = inner
        self.eos_token_id = inner.eos_token_id
        self.on_disconnect = on_disconnect
        self.faults: list[Fault] = []
        self.calls: list[tuple[str, tuple[str, ...]]] = []   # model calls since the last take_calls()
        self.num_calls: dict[tuple[str, str], int] = {}      # (call, seq_id) -> calls so far
        self.fired: list[tuple[Fault, tuple[str, ...]]] = []  # (fault, rows of the call it hit)
        self.prompt_rules: list[tuple[str, str, tuple[str, ...], int]] = []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def arm(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        return fault

    def arm_on_prompt(self, marker: str, kind: str, calls: Sequence[str], skip: int = 0) -> None:
        """Requests whose prompt text contains `marker` get `kind` on their `skip`+1-th matching call
        (the server picks request ids, so a test can only name a request by its prompt)."""
        self.prompt_rules.append((marker, kind, tuple(calls), skip))

    def take_calls(self) -> list[tuple[str, tuple[str, ...]]]:
        calls, self.calls = self.calls, []
        return calls

    def _gate(self, call: str, seq_ids: tuple[str, ...]) -> None:
        self.calls.append((call, seq_ids))
        for seq_id in seq_ids:
            self.num_calls[call, seq_id] = self.num_calls.get((call, seq_id), 0) + 1
        for fault in [f for f in self.faults if f.matches(call, seq_ids)]:
            if fault.skip > 0:
                fault.skip -= 1
                continue
            if not fault.persistent:
                self.faults.remove(fault)
            self.fired.append((fault, seq_ids))
            hit = seq_ids[0] if fault.seq_id == ANY else fault.seq_id
            if fault.kind == "disconnect":
                if self.on_disconnect is not None:
                    self.on_disconnect(hit)
            elif fault.kind == "raise":
                raise BackendError(f"injected {call} failure for {hit!r}", (hit,))
            else:
                raise InjectedFault(f"injected {call} failure")

    # -- ModelBackend ---------------------------------------------------------
    @property
    def num_live(self) -> int:
        return self.inner.num_live

    def prefill(self, seq_id, prompt, params, with_draft, shared=False):
        for marker, kind, calls, skip in self.prompt_rules:
            if marker in self.inner.detokenize(prompt):
                for call in calls:
                    self.arm(Fault(kind, call, seq_id, skip=skip))
        self._gate("prefill", (seq_id,))
        return self.inner.prefill(seq_id, prompt, params, with_draft, shared)

    def prefill_batch(self, rows, shared=False):
        """Logged and faulted as a `prefill` of every row of the call (one forward)."""
        for row in rows:
            if row.start == 0:
                for marker, kind, calls, skip in self.prompt_rules:
                    if marker in self.inner.detokenize(row.prompt):
                        for call in calls:
                            self.arm(Fault(kind, call, row.seq_id, skip=skip))
        self._gate("prefill", tuple(row.seq_id for row in rows))
        return self.inner.prefill_batch(rows, shared)

    def decode(self, rows):
        self._gate("decode", tuple(r[0] for r in rows))
        return self.inner.decode(rows)

    def draft(self, rows, num_tokens):
        self._gate("draft", tuple(r[0] for r in rows))
        return self.inner.draft(rows, num_tokens)

    def verify(self, rows):
        self._gate("verify", tuple(r[0] for r in rows))
        return self.inner.verify(rows)

    def fused(self, decode_rows, verify_rows):
        self._gate("fused", tuple(r[0] for r in decode_rows) + tuple(r[0] for r in verify_rows))
        return self.inner.fused(decode_rows, verify_rows)

    def rewind(self, seq_id, num_tokens):
        self.inner.rewind(seq_id, num_tokens)

    def release(self, seq_id):
        self.inner.release(seq_id)

    def detokenize(self, token_ids):
        return self.inner.detokenize(token_ids)
