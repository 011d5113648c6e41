"""The engine worker behind the HTTP server: one thread, real time, per-request asyncio queues.

HTTP handlers call `submit`/`cancel` (the engine's thread-safe inbox); the worker
thread publishes each TokenEvent to its request's queue through
`loop.call_soon_threadsafe`, and updates the metrics from the same thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from dataclasses import dataclass

from coopsched.core import Committed, Request, Scheduler, SchedulerConfig, TokenEvent
from coopsched.core.request import SamplingParams
from coopsched.engine import Engine

from . import protocol
from .metrics import Metrics
from .models import ServedModel

log = logging.getLogger("coopsched.server")


@dataclass(frozen=True)
class Delivery:
    """One message to a request's handler: tokens, the finish, or a failure."""
    token_ids: tuple[int, ...] = ()
    time_ms: float = 0.0
    finish_reason: str | None = None
    error: Exception | None = None
    served_speculatively: bool = False
    burst: dict | None = None
    timings: dict | None = None  # on the finish: llama.cpp's timings object


@dataclass(eq=False)
class Live:
    request: Request
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    received_ms: float
    first_ms: float | None = None
    last_ms: float | None = None
    num_tokens: int = 0

    def timings(self, end_ms: float, burst: dict | None, draft_kind: str) -> dict:
        first = end_ms if self.first_ms is None else self.first_ms
        last = first if self.last_ms is None else self.last_ms
        return protocol.timings(len(self.request.prompt_token_ids), first - self.received_ms, self.num_tokens,
                                last - first, burst, draft_kind)


class QueueFull(Exception):
    pass


class ModelCallFailed(RuntimeError):
    """The backend failed on this request's rows; other requests carry on."""


class EngineHost:
    def __init__(self, model: ServedModel, config: SchedulerConfig, clock, max_queue: int = 256) -> None:
        self.model = model
        self.config = config
        self.clock = clock
        self.max_queue = max_queue
        self.scheduler = Scheduler(config, keep_history=False)  # a server keeps no per-request history
        self.engine = Engine(self.scheduler, model.backend, clock, on_event=self._on_event, on_tick=self._on_tick)
        self.metrics = Metrics()
        self.metrics.watch(self.scheduler)
        self.metrics.watch_engine(self.engine)
        self.failure: BaseException | None = None
        self._live: dict[str, Live] = {}
        self._num_waiting = 0         # submitted, no first token yet (the 429 gate)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()

    @property
    def draft_kind(self) -> str:
        """What drafts: upstream's B = 1 drafter is MTP unless the gates name DFlash."""
        return "dflash" if self.config.draft_kind == "dflash" else "mtp"

    # -- lifecycle --------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="coopsched-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.engine.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def is_healthy(self) -> bool:
        return self.failure is None and self._thread is not None and self._thread.is_alive()

    def _serve(self) -> None:
        try:
            self.engine.serve_forever(on_error=self._on_submit_error)
        except BaseException as exc:  # a backend failure: fail every live request, report unhealthy
            log.exception("engine worker died")
            self.failure = exc
            with self._lock:
                doomed, self._live = list(self._live.values()), {}
            for live in doomed:
                self._deliver(live, Delivery(error=exc))

    # -- from HTTP handlers (event loop thread) -----------------------------------
    def new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    def submit(self, seq_id: str, prompt: list[int], max_tokens: int, stop: tuple[str, ...],
               speculative: bool, sampling: SamplingParams) -> Live:
        request = Request(id=seq_id, prompt_token_ids=tuple(prompt), max_tokens=max_tokens,
                          sampling=sampling, stop=stop, speculative=speculative)
        live = Live(request, asyncio.get_running_loop(), asyncio.Queue(), self.clock.now())
        with self._lock:
            if self._num_waiting >= self.max_queue:
                raise QueueFull(f"{self._num_waiting} requests are waiting for their first token; "
                                f"the queue holds {self.max_queue} (--max-queue)")
            self._num_waiting += 1
            self._live[seq_id] = live
        self.engine.submit(request)
        return live

    def fail_open(self, error: Exception) -> int:
        """End every open request with `error` (the server is stopping) and cancel its row."""
        with self._lock:
            doomed, self._live, self._num_waiting = list(self._live.values()), {}, 0
        for live in doomed:
            self.engine.cancel(live.request.id)
            self._deliver(live, Delivery(error=error))
        return len(doomed)

    def cancel(self, seq_id: str) -> None:
        """The client went away: the row stops at its next round or decode step, freeing its slot."""
        with self._lock:
            is_live = seq_id in self._live
        if is_live:
            self.engine.cancel(seq_id)

    # -- on the worker thread ---------------------------------------------------------
    def _deliver(self, live: Live, delivery: Delivery) -> None:
        try:
            live.loop.call_soon_threadsafe(live.queue.put_nowait, delivery)
        except RuntimeError:  # the handler's loop is closed (server shutting down)
            pass

    def _on_event(self, event: TokenEvent) -> None:
        with self._lock:
            live = self._live.get(event.seq_id)
            if live is None:
                return
            if live.num_tokens == 0 and (event.token_ids or event.finish_reason):
                self._num_waiting -= 1
            if event.finish_reason is not None:
                del self._live[event.seq_id]
        request = live.request
        kind = "spec" if request.served_speculatively else "classic"
        if event.token_ids:
            ttft = event.time_ms - live.received_ms if live.num_tokens == 0 else None
            gaps = [] if live.last_ms is None else [event.time_ms - live.last_ms]
            gaps += [0.0] * (len(event.token_ids) - 1)  # one round's tokens arrive together
            self.metrics.observe_tokens(kind, ttft, gaps)
            live.num_tokens += len(event.token_ids)
            if live.first_ms is None:
                live.first_ms = event.time_ms
            live.last_ms = event.time_ms
        outcome = event.outcome
        burst = outcome.burst.to_json() if outcome is not None and outcome.burst is not None else None
        reason = event.finish_reason.value if event.finish_reason is not None else None
        if reason == "error":  # a failed model call ended only this request: tokens so far, then the error
            if event.token_ids:
                self._deliver(live, Delivery(event.token_ids, event.time_ms))
            error = outcome.error if outcome is not None else None
            self._deliver(live, Delivery(error=ModelCallFailed(error or "the model call failed")))
            return
        times = live.timings(event.time_ms, burst, self.draft_kind) if reason is not None else None
        self._deliver(live, Delivery(event.token_ids, event.time_ms, reason,
                                     served_speculatively=request.served_speculatively, burst=burst,
                                     timings=times))

    def _on_tick(self, committed: Committed) -> None:
        self.metrics.record_tick(committed)

    def _on_submit_error(self, request: Request, exc: Exception) -> None:
        with self._lock:
            live = self._live.pop(request.id, None)
            if live is not None:
                self._num_waiting -= 1
        if live is not None:
            self._deliver(live, Delivery(error=exc))
