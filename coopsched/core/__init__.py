"""The pure core: types, tick policies (one per mode), scheduler state and books, speculative jobs.

No I/O, no clock reads, no threads, no env reads, no mlx, no model calls: time
arrives as arguments and the executor (coopsched/executor.py) runs each plan.
"""

from .backend import ModelBackend
from .config import SchedulerConfig
from .dispatch import Route, dispatch
from .modes import MODES, POLICIES, make_policy
from .observability import BatchObservability
from .plan import Committed, Decode, Plan, Prefill, Result, Verify
from .policy import Decision, TickPolicy, decide_action
from .request import Priority, Request, RequestError, RequestState, SamplingParams
from .scheduler import Scheduler
from .spec import accept_walk
from .types import (
                    ActionKind,
                    BurstFinalized,
                    FinishReason,
                    RequestOutcome,
                    TickDeltas,
                    TickKind,
                    TickRecord,
                    TickState,
                    TokenEvent,
)

__all__ = [
    "MODES", "POLICIES", "ActionKind", "BatchObservability", "BurstFinalized", "Committed", "Decision",
    "Decode", "FinishReason", "ModelBackend", "Plan", "Prefill", "Priority", "Request", "RequestError",
    "RequestOutcome", "RequestState", "Result", "Route", "SamplingParams", "Scheduler", "SchedulerConfig",
    "TickDeltas", "TickKind", "TickPolicy", "TickRecord", "TickState", "TokenEvent", "Verify", "accept_walk",
    "decide_action", "dispatch", "make_policy",
]
