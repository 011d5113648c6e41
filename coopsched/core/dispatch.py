"""Where a request goes when it reaches the head of the prefill queue.

A pure function of the request, the config and the speculative slot, so the
(request shape x gates) -> outcome table can be golden-tested (README: "Environment gates").
"""

from __future__ import annotations

import enum
from collections.abc import Hashable

from .config import SchedulerConfig
from .request import Request


class Route(str, enum.Enum):
    CLASSIC = "classic"
    SPEC_B1 = "speculative_b1"
    WINDOW = "batched_window"
    WAITER = "waiter"


def is_eligible(request: Request, config: SchedulerConfig) -> bool:
    """Speculation configured, the request did not opt out, and it has a prompt."""
    return config.has_drafter and request.speculative and len(request.prompt_token_ids) > 0


def shape_key(request: Request, ragged: bool) -> Hashable:
    """Window siblings share it: prompt length (unless ragged), max_tokens and sampling."""
    return (None if ragged else len(request.prompt_token_ids), request.max_tokens, request.sampling)


def dispatch(request: Request, config: SchedulerConfig, *, slot_busy: bool,
             backlog_has_room: bool, num_siblings: int) -> Route:
    if not is_eligible(request, config):
        return Route.CLASSIC
    if slot_busy:
        may_wait = config.grant_rounds > 0 and backlog_has_room and config.enable_b1
        return Route.WAITER if may_wait else Route.CLASSIC
    if config.enable_batch and num_siblings > 0:
        return Route.WINDOW
    return Route.SPEC_B1 if config.enable_b1 else Route.CLASSIC
