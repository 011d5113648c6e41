"""The worker loop: drain arrivals -> plan -> execute on the backend -> commit -> publish events.

`run` drives arrivals to completion (virtual or real clock): a list, or an
`Arrivals` that may grow while it runs (a closed loop submits on finish);
`serve_forever` is the real-time worker a server thread runs, fed by `submit`
and `cancel` from other threads through an inbox.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .core.backend import ModelBackend
from .core.request import Request
from .core.scheduler import Scheduler
from .core.types import ActionKind, Committed, TickKind, TickRecord, TokenEvent
from .executor import Executor


@dataclass
class RunResult:
    ticks: list[TickRecord] = field(default_factory=list)
    events: list[TokenEvent] = field(default_factory=list)


class Arrivals:
    """Requests not yet submitted, earliest arrival_ms first (ties keep insertion order).

    `on_finish` sees every finish event of a run: a subclass may `push` more requests
    then (a closed loop's next request arrives the instant its previous one finishes).
    """

    def __init__(self, requests: Iterable[Request] = ()) -> None:
        self._heap: list[tuple[float, int, Request]] = []
        self._seq = itertools.count()
        for request in requests:
            self.push(request)

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.arrival_ms, next(self._seq), request))

    def next_ms(self) -> float:
        return self._heap[0][0]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[2]

    def on_finish(self, event: TokenEvent) -> None:
        """A request finished at event.time_ms; a fixed list of arrivals ignores it."""


class Engine:
    def __init__(self, scheduler: Scheduler, backend: ModelBackend, clock,
                 on_event: Callable[[TokenEvent], None] | None = None,
                 on_tick: Callable[[Committed], None] | None = None) -> None:
        self.scheduler = scheduler
        self.executor = Executor(backend)
        self.clock = clock
        self.on_event = on_event
        self.on_tick = on_tick
        self._inbox: queue.Queue = queue.Queue()
        self._wake = threading.Event()
        self._stop = threading.Event()

    def step(self, join: Callable[[float, float], None] | None = None) -> Committed:
        """One tick: plan exactly one action, run it, commit it, timed by the injected clock.

        `join(start_ms, end_ms)` submits the requests that arrived while the tick ran, before its
        commit: they waited on this tick from their arrival, and its books (HOL) count them."""
        scheduler, clock, on_event = self.scheduler, self.clock, self.on_event
        plan = scheduler.schedule()
        start = clock.now()
        outcome = self.executor.run(plan)
        end = clock.now()
        if join is not None:
            join(start, end)
        committed = scheduler.commit(plan, outcome, start, end)
        if on_event:
            for event in committed.events:
                on_event(event)
        if self.on_tick:
            self.on_tick(committed)
        return committed

    def run(self, arrivals: Iterable[Request] | Arrivals, keep_events: bool = True) -> RunResult:
        """Submit each request at its arrival_ms and tick until every one has finished."""
        pending = arrivals if isinstance(arrivals, Arrivals) else Arrivals(arrivals)
        result = RunResult()
        scheduler, clock, ticks = self.scheduler, self.clock, result.ticks

        def join(start_ms: float, end_ms: float) -> None:
            while pending and pending.next_ms() < end_ms:
                request = pending.pop()
                scheduler.submit(request, request.arrival_ms - start_ms)
        while pending or scheduler.has_work:
            now = clock.now()
            while pending and pending.next_ms() <= now:
                scheduler.submit(pending.pop())
            if scheduler.is_idle:
                if not pending:
                    if scheduler.requests:
                        raise RuntimeError(f"scheduler stalled with live requests "
                                           f"{sorted(scheduler.requests)} and nothing to do")
                    break
                clock.advance_to(pending.next_ms())
                ticks.append(TickRecord(now, clock.now(), ActionKind.IDLE, TickKind.IDLE, ()))
                continue
            committed = self.step(join)
            ticks.append(committed.record)
            if keep_events:
                result.events.extend(committed.events)
            for event in committed.events:
                if event.finish_reason is not None:
                    pending.on_finish(event)
        return result

    # -- real-time worker (server) -------------------------------------------
    def submit(self, request: Request) -> None:
        request.arrival_ms = self.clock.now()  # when it reached the engine: a tick may be running
        self._inbox.put(("submit", request))
        self._wake.set()

    def cancel(self, seq_id: str) -> None:
        self._inbox.put(("cancel", seq_id))
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def serve_forever(self, on_error: Callable[[Request, Exception], None] | None = None) -> None:
        def join(start_ms: float, end_ms: float) -> None:  # what arrived during the tick, before its commit
            self._drain_inbox(on_error, start_ms)

        while not self._stop.is_set():
            self._drain_inbox(on_error)
            if self.scheduler.is_idle:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            self.step(join)

    def _drain_inbox(self, on_error, tick_start_ms: float | None = None) -> None:
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "cancel":
                self.scheduler.cancel(item)
                continue
            try:
                self.scheduler.submit(item, 0.0 if tick_start_ms is None else item.arrival_ms - tick_start_ms)
            except ValueError as exc:
                if on_error:
                    on_error(item, exc)

