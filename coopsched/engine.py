"""The worker loop: arrivals -> schedule -> run -> commit -> apply -> events, one tick at a time.

`run` drives arrivals to completion (virtual or real clock; an `Arrivals` may grow while it
runs: a closed loop submits on finish); `serve_forever` is the real-time worker a server thread
runs, fed by `submit` and `cancel` from other threads through an inbox.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .core.backend import ModelBackend
from .core.plan import Committed
from .core.request import Request, RequestError
from .core.scheduler import Scheduler
from .core.types import ActionKind, TickKind, TickRecord, TokenEvent
from .executor import Executor

Arrived = Callable[[float], list[Request]]  # requests that reached the engine before a time (ms)
NOTHING: list[Request] = []  # nothing arrived (never appended to)


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
        if scheduler.vocab is None:
            scheduler.vocab = backend  # the stop rules read the model's EOS and detokenizer
        self.executor = Executor(backend)
        self.clock = clock
        self.on_event = on_event
        self.on_tick = on_tick
        self._inbox: queue.Queue = queue.Queue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.busy_ms = 0.0  # serve_forever: the worker's time in its steps (plan, run, commit, deliveries)

    def step(self, arrived: Arrived | None = None) -> Committed:
        """One tick: plan one action, run it, commit it (with the requests that arrived by its end),
        apply what the commit says; a burst repeats run + commit inside the one tick."""
        scheduler, executor, clock = self.scheduler, self.executor, self.clock
        plan = scheduler.schedule()
        start = clock.now()
        while True:
            result = executor.run(plan)
            end = clock.now()
            committed = scheduler.commit(plan, result, start, end, arrived(end) if arrived is not None else ())
            if committed.rewinds or committed.releases:
                for seq_id, why in executor.apply(committed.rewinds, committed.releases):
                    scheduler.fail(seq_id, why)  # its cache is wrong: it ends before its next round
            if not committed.continues:
                break
            plan = scheduler.next_round(plan)
        if self.on_tick:  # the tick's counters are booked before any request hears it finished
            self.on_tick(committed)
        if self.on_event:
            for event in committed.events:
                self.on_event(event)
        return committed

    def run(self, arrivals: Iterable[Request] | Arrivals, keep_events: bool = True) -> RunResult:
        """Submit each request at its arrival_ms and tick until every one has finished."""
        pending = arrivals if isinstance(arrivals, Arrivals) else Arrivals(arrivals)
        result = RunResult()
        scheduler, clock, ticks = self.scheduler, self.clock, result.ticks

        def arrived(end_ms: float) -> list[Request]:
            if not pending or pending.next_ms() >= end_ms:
                return NOTHING
            out: list[Request] = []
            while pending and pending.next_ms() < end_ms:
                out.append(self._checked(pending.pop(), out))
            return out
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
            committed = self.step(arrived)
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
        cancels: list[str] = []  # cancels that came during a tick take effect after it (a burst too)

        def arrived(end_ms: float) -> list[Request]:  # what reached the inbox while the tick ran
            return self._drain_inbox(on_error, cancels)

        while not self._stop.is_set():
            for request in self._drain_inbox(on_error, cancels):
                self.scheduler.submit(request)
            for seq_id in cancels:
                self.scheduler.cancel(seq_id)
            cancels.clear()
            if self.scheduler.is_idle:
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            begin = self.clock.now()
            self.step(arrived)
            self.busy_ms += self.clock.now() - begin

    def _drain_inbox(self, on_error, cancels: list[str]) -> list[Request]:
        """Valid submissions (a bad one goes to on_error); cancels are collected."""
        out: list[Request] = []
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return out
            if kind == "cancel":
                cancels.append(item)
                continue
            try:
                out.append(self._checked(item, out))
            except ValueError as exc:
                if on_error:
                    on_error(item, exc)

    def _checked(self, request: Request, arrived: list[Request]) -> Request:
        """The request if the scheduler could queue it after those that arrived with it."""
        self.scheduler.validate(request)
        if any(r.id == request.id for r in arrived):
            raise RequestError(f"request id {request.id!r} is already live")
        return request

