"""Scheduler configuration: a frozen record that only validates ranges.

The env gates (coopsched/env.py) map onto it; nothing here reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .modes import MODES, make_policy

DRAFT_KINDS = ("auto", "mtp", "dflash")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    mode: str = "slice"            # burst = legacy run-to-completion; slice = one round per tick
    max_batch_size: int = 8        # classic decode rows
    num_kv_slots: int = 16
    slot_tokens: int = 4096        # context a slot holds: prompt + max_tokens must fit
    block_size: int = 4            # K: one round drafts K-1 tokens and verifies K positions
    grant_rounds: int = 8          # G: slices per rotation grant; 0 = no rotation, no waiters
    backlog_cap: int = 2
    skip_cap: int = 2
    has_drafter: bool = True       # speculative dispatch configured at all
    enable_b1: bool = True         # B = 1 speculative sessions
    enable_batch: bool = False     # B > 1 speculative windows
    enable_ragged: bool = False    # windows of mixed prompt lengths
    max_window: int = 8
    draft_kind: str = "auto"       # "dflash" is never sliced
    hol_budget_ms: float = 50.0    # cost mode: longest a classic row may wait on speculation
    prefill_chunk_tokens: int = 0  # N > 0: a prefill tick prefills at most N prompt tokens; 0 = whole prompts
    max_batch_prefill: int = 1     # classic requests one prefill tick may admit together (one forward)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is not one of {', '.join(MODES)}")
        if self.draft_kind not in DRAFT_KINDS:
            raise ValueError(f"draft_kind={self.draft_kind!r} is not one of {', '.join(DRAFT_KINDS)}")
        if self.block_size < 2:
            raise ValueError(f"block_size={self.block_size}: K must be >= 2 (one draft, one verify)")
        for name in ("max_batch_size", "num_kv_slots", "slot_tokens", "max_window", "max_batch_prefill"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        for name in ("grant_rounds", "backlog_cap", "skip_cap", "prefill_chunk_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if self.hol_budget_ms <= 0:
            raise ValueError(f"hol_budget_ms={self.hol_budget_ms} must be > 0")

    @property
    def is_chunked(self) -> bool:
        """Whether long prompts are prefilled in chunks of `prefill_chunk_tokens`."""
        return self.prefill_chunk_tokens > 0

    @property
    def is_sliced(self) -> bool:
        """Whether speculative requests yield between rounds (dflash never does)."""
        return not make_policy(self.mode, self).keeps_slot  # the mode's own answer, not a second copy

    def with_(self, **overrides: Any) -> SchedulerConfig:
        return replace(self, **overrides)
