"""What the scheduler reports: tick records, BurstFinalized, BatchObservability.

All times are the ones the engine passed in (ms); nothing here reads a clock.
HOL wait is the time classic rows with pending work (decode rows plus queued
requests, not the speculative backlog) spend waiting on speculative actions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .spec import SpecStats


@dataclass(frozen=True, slots=True)
class TickRecord:
    start_ms: float
    end_ms: float
    action: str               # prefill | decode | spec_round | fused | idle
    request_ids: tuple[str, ...]
    detail: str = ""          # admit | slice0 | burst | window | park | round | grant | cancel

    @property
    def wall_ms(self) -> float:
        return self.end_ms - self.start_ms

    def to_json(self) -> dict:
        return {"start_ms": self.start_ms, "end_ms": self.end_ms, "action": self.action,
                "request_ids": list(self.request_ids), "detail": self.detail}


@dataclass(frozen=True, slots=True)
class BurstFinalized:
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
    def of(cls, seq_id: str, stats: SpecStats, tokens_generated: int) -> "BurstFinalized":
        return cls(seq_id=seq_id, burst_wall_ms=stats.wall_ms, burst_active_ms=stats.active_ms,
                   slices=stats.slices, rounds=stats.rounds,
                   accepted_draft_tokens=stats.accepted, drafted_tokens=stats.drafted,
                   tokens_generated=tokens_generated, hol_waiters=stats.hol_waiters)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(slots=True)
class BatchObservability:
    rounds: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    slices: int = 0
    hol_wait_ms: list[float] = field(default_factory=list)  # one sample per row per wait
    hol_waiters_max: int = 0
    waiter_parks: int = 0       # Prefill ticks that only parked a waiter (the yield-flag quirk)
    grant_log: list[str] = field(default_factory=list)
    bursts: list[BurstFinalized] = field(default_factory=list)
