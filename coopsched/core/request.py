"""Requests, their states and finish reasons.

A Request is created by a client (harness, server) and then owned by the
scheduler: only the scheduler mutates its state and output.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .types import FinishReason


class Priority(enum.IntEnum):
    HIGH = 0
    NORMAL = 1
    LOW = 2


class RequestState(enum.Enum):
    WAITING = "waiting"          # in the prefill queue
    PREFILLING = "prefilling"    # admitted, its prompt prefilled in chunks: joins the batch when done
    RUNNING = "running"          # a row of the classic decode batch
    SPECULATIVE = "speculative"  # a row of the active speculative job
    PARKED = "parked"            # in the rotation backlog
    FINISHED = "finished"


class RequestError(ValueError):
    """A request that can never be served (empty prompt, cannot fit a KV slot)."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0
    seed: int | None = None
    min_tokens: int = 0        # EOS is never sampled before this many output tokens (vLLM's extension)
    ignore_eos: bool = False   # EOS is never sampled: the request runs to max_tokens (or a stop string)

    def suppresses_eos(self, output_index: int) -> bool:
        """Whether output token `output_index` (0-based) may not be EOS: the sampler picks another."""
        return self.ignore_eos or output_index < self.min_tokens


@dataclass(eq=False, slots=True)
class Request:
    id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int = 16
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    speculative: bool = True  # eligible for speculation; False = the client opted out
    priority: Priority = Priority.NORMAL
    arrival_ms: float = 0.0
    # Owned by the scheduler from submit() on.
    state: RequestState = RequestState.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    is_cancelled: bool = False
    served_speculatively: bool = False
    last_token: int | None = None  # sampled, not yet fed to the model
    num_prefilled: int = 0         # prompt tokens in the backend's caches (chunked prefill)
    error: str | None = None

    def __post_init__(self) -> None:
        self.prompt_token_ids = tuple(self.prompt_token_ids)
        self.stop = tuple(self.stop)
        if self.max_tokens < 1:
            raise RequestError(f"request {self.id!r}: max_tokens={self.max_tokens} must be >= 1")
        if self.sampling.temperature < 0:
            raise RequestError(
                f"request {self.id!r}: temperature={self.sampling.temperature} must be >= 0")
        if self.sampling.min_tokens < 0:
            raise RequestError(f"request {self.id!r}: min_tokens={self.sampling.min_tokens} must be >= 0")
        if self.sampling.min_tokens > self.max_tokens:
            raise RequestError(f"request {self.id!r}: min_tokens={self.sampling.min_tokens} is more than "
                               f"max_tokens={self.max_tokens}")

    @property
    def num_remaining(self) -> int:
        return self.max_tokens - len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.state is RequestState.FINISHED
