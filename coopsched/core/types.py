"""The records every part of coopsched shares: actions, tick kinds, token events, tick records.

A tick's kind is set where the work is planned or fails, never parsed from text later (the
bounds, the cost arbiter and the reports read `TickRecord.kind`). Times are the engine's (ms).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import NamedTuple


class ActionKind(str, enum.Enum):
    """The one action a tick runs."""
    PREFILL = "prefill"
    DECODE = "decode"
    SPEC_ROUND = "spec_round"
    FUSED = "fused"
    IDLE = "idle"


class TickKind(enum.Enum):
    """What a tick did, finer than its action (the trace's `detail`)."""
    ADMIT = "admit"      # a classic prefill: the queue head joins the decode batch
    PARK = "park"        # a speculative request parks as a waiter (bookkeeping, no model work)
    SLICE0 = "slice0"    # a speculative request's prefill + first token (granted waiters too)
    WINDOW = "window"    # slice 0 of a B > 1 window
    BURST = "burst"      # the legacy burst: a whole speculative request in one tick
    ROUND = "round"      # one speculative round of the active job
    GRANT = "grant"      # a round of a job re-granted the slot after rotation
    FUSED = "fused"      # classic decode rows and a speculative verify in one forward
    CHUNK = "chunk"      # chunked prefill: a piece of a prompt prefilled across ticks (classic or slice 0)
    DECODE = "decode"    # one batched step of the classic rows
    IDLE = "idle"
    ERROR = "error"      # a model call failed; only its rows ended

    @property
    def detail(self) -> str:
        """The trace spelling: decode and idle ticks carry no detail."""
        return "" if self in (TickKind.DECODE, TickKind.IDLE) else self.value

    @property
    def is_spec_admission(self) -> bool:
        """A speculative request's admission: the bounds allow its slice 0 once per gap."""
        return self in SPEC_ADMISSIONS


SPEC_ADMISSIONS = frozenset({TickKind.SLICE0, TickKind.WINDOW, TickKind.BURST})
PREFILL_KINDS = frozenset({TickKind.ADMIT, TickKind.SLICE0, TickKind.WINDOW, TickKind.BURST, TickKind.CHUNK})


class FinishReason(str, enum.Enum):
    STOP = "stop"      # stop string, EOS, cancel or early bail
    LENGTH = "length"  # max_tokens reached
    ERROR = "error"    # a model call failed for this request (Request.error says why)


class TickState(NamedTuple):
    """What the tick policy decides from: a small frozen record, so policies are table-tested."""
    has_spec_work: bool = False      # an active job or a non-empty backlog
    num_running: int = 0             # classic rows in the decode batch
    max_batch_size: int = 8
    num_admissible: int = 0          # queued requests that could be admitted now (a KV slot is free)
    has_chunked_prefill: bool = False  # a classic prefill under way in chunks (its rows join the batch when done)
    last_was_spec: bool = False      # the yield flag
    num_queued: int = 0              # every queued request, admissible or not
    num_free_slots: int = 0          # KV slots free
    prefill_yields: bool = False     # chunking: a prefill ran since the batch was served; the decode rows go next
    spec_prefilling: bool = False    # chunking: the next speculative job's slice 0 is unfinished (never fused)


@dataclass(slots=True)
class SpecStats:
    """Per-request speculative counters, reported in its BurstFinalized record."""
    slices: int = 0          # ticks it did model work in (1 for a legacy burst)
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    wall_ms: float = 0.0     # longest single tick it occupied
    active_ms: float = 0.0   # sum of its slice walls
    hol_waiters: int = 0     # most classic rows waiting on it at once


@dataclass(frozen=True, slots=True)
class BurstFinalized:
    """One speculative request's summary, made when it finishes (the upstream log line)."""
    seq_id: str
    burst_wall_ms: float
    burst_active_ms: float
    slices: int
    rounds: int
    accepted_draft_tokens: int
    drafted_tokens: int
    tokens_generated: int
    hol_waiters: int

    @classmethod
    def of(cls, seq_id: str, stats: SpecStats, tokens_generated: int) -> BurstFinalized:
        return cls(seq_id=seq_id, burst_wall_ms=stats.wall_ms, burst_active_ms=stats.active_ms,
                   slices=stats.slices, rounds=stats.rounds,
                   accepted_draft_tokens=stats.accepted, drafted_tokens=stats.drafted,
                   tokens_generated=tokens_generated, hol_waiters=stats.hol_waiters)

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """How a request ended; it travels with the request's finish event."""
    finish_reason: FinishReason
    served_speculatively: bool
    burst: BurstFinalized | None = None   # speculative requests that began
    error: str | None = None              # FinishReason.ERROR: what failed


@dataclass(slots=True)
class TokenEvent:
    """Tokens a tick made visible for one request (at `time_ms`, the tick's end), and its finish."""
    seq_id: str
    token_ids: tuple[int, ...]
    time_ms: float
    finish_reason: FinishReason | None = None
    outcome: RequestOutcome | None = None  # set on the finish event


@dataclass(slots=True)
class TickRecord:
    start_ms: float
    end_ms: float
    action: ActionKind
    kind: TickKind
    request_ids: tuple[str, ...]
    prefill_tokens: tuple[int, ...] = ()  # chunk ticks: prompt tokens each row prefilled (by request_ids)

    @property
    def wall_ms(self) -> float:
        return self.end_ms - self.start_ms

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"start_ms": self.start_ms, "end_ms": self.end_ms, "action": self.action.value,
                                  "request_ids": list(self.request_ids), "detail": self.kind.detail}
        if self.kind is TickKind.CHUNK:
            out["prefill_tokens"] = list(self.prefill_tokens)
        return out


class TickDeltas(NamedTuple):
    """What one committed tick adds to the books: a server exports these, never the books."""
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    slices: int = 0
    hol_waits: tuple[tuple[float, int], ...] = ()  # (wait ms, how many rows waited it)
    hol_waiters: int = 0                           # rows waiting on this tick's speculative work

