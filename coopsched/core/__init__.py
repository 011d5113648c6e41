"""The pure core: tick policy, scheduler state, speculative jobs, KV slots, observability.

No I/O, no clock reads, no threads, no env reads, no mlx: time arrives as arguments.
"""

from .backend import ModelBackend
from .config import MODES, SchedulerConfig
from .dispatch import Route, dispatch
from .observability import BatchObservability, BurstFinalized, TickRecord
from .policy import ActionKind, TickState, decide_action
from .request import FinishReason, Priority, Request, RequestError, RequestState, SamplingParams
from .scheduler import Scheduler, TokenEvent
from .spec import accept_walk

__all__ = [
    "MODES", "ActionKind", "BatchObservability", "BurstFinalized", "FinishReason", "ModelBackend",
    "Priority", "Request", "RequestError", "RequestState", "Route", "SamplingParams", "Scheduler",
    "SchedulerConfig", "TickRecord", "TickState", "TokenEvent", "accept_walk", "decide_action",
    "dispatch",
]
