"""The scheduler modes, one TickPolicy per file; a new mode is a file here plus its line below."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..policy import TickPolicy
from .burst import BurstPolicy
from .cost import CostPolicy
from .fused import FusedPolicy
from .slice import SlicePolicy


class PolicyConfig(Protocol):
    """The knobs a policy may read (SchedulerConfig has them all)."""
    @property
    def block_size(self) -> int: ...
    @property
    def draft_kind(self) -> str: ...
    @property
    def hol_budget_ms(self) -> float: ...
    @property
    def prefill_chunk_tokens(self) -> int: ...
    @property
    def prefill_grant_interval(self) -> int: ...
    @property
    def mixed_step(self) -> bool: ...


POLICIES: dict[str, Callable[[Any], TickPolicy]] = {
    "burst": BurstPolicy,  # legacy: a speculative request runs whole inside its admission tick
    "slice": SlicePolicy,  # upstream's fix: one round per tick, strict alternation
    "fused": FusedPolicy,  # classic rows and the verify in one forward
    "cost": CostPolicy,    # rounds budgeted in ms against the classic rows' wait
}
MODES = tuple(POLICIES)


def make_policy(mode: str, config: PolicyConfig) -> TickPolicy:
    try:
        policy: TickPolicy = POLICIES[mode](config)
    except KeyError:
        raise ValueError(f"mode={mode!r} is not one of {', '.join(MODES)}") from None
    return policy
