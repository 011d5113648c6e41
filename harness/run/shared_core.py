"""A frontend sharing the engine's core: each arrival's frontend work holds the core from its send,
and a forward that overlaps it finishes that much later (the frontend first: its work is short and
the OS schedules the waking process), computed from the open-loop send times alone; and a request
sent while the engine is in a step reaches it later than one sent to an idle engine (its frontend
waits for the core), and one sent to an engine idle a while later still (a cold server), decided as
the steps are charged."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence

from coopsched.core import Request
from coopsched.engine import Arrivals
from coopsched.twins.base import idle_extra_ms


def busy_spans(sends_ms: Iterable[float], stall_ms: float) -> list[tuple[float, float]]:
    """The frontend's busy spans: `stall_ms` of work from each send, served in arrival order (work
    arriving while the frontend is busy queues behind it)."""
    spans: list[tuple[float, float]] = []
    for send in sorted(sends_ms):
        start = max(send, spans[-1][1]) if spans else send
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], start + stall_ms)
        else:
            spans.append((start, start + stall_ms))
    return spans


def stretched_end(spans: list[tuple[float, float]], start_ms: float, work_ms: float) -> float:
    """When `work_ms` of the engine's work begun at `start_ms` ends, the core given to the frontend
    whenever it is busy."""
    now, left = start_ms, work_ms
    for begin, end in spans[max(bisect_right(spans, (start_ms, float("inf"))) - 1, 0):]:
        if end <= now:
            continue
        if begin > now:
            if now + left <= begin:
                break
            left -= begin - now
        now = end
    return now + left


class SharedCoreClock:
    """The clock a backend charges through: each charge is stretched by the frontend's busy spans it
    overlaps; everything else is the wrapped clock's."""

    def __init__(self, clock, sends_ms: Iterable[float], stall_ms: float) -> None:
        self._clock = clock
        self.spans = busy_spans(sends_ms, stall_ms)

    def sleep(self, ms: float) -> None:
        start = self._clock.now()
        self._clock.sleep(stretched_end(self.spans, start, ms) - start)

    def __getattr__(self, name: str):
        return getattr(self._clock, name)


def wake_charge(scheduler, clock, wake_ms: float):
    """An Engine on_tick that charges, after each step, the core time its streamed tokens take waking
    the HTTP threads of every request in the server beyond the step's rows (llama-server's result
    queue wakes every waiting thread for each result it sends): wake_ms x tokens x those requests."""
    def on_tick(committed) -> None:
        tokens = sum(len(e.token_ids) for e in committed.events)
        finished = sum(e.finish_reason is not None for e in committed.events)
        others = len(scheduler.requests) + finished - len(committed.plan.seq_ids)
        if tokens and others > 0:
            clock.sleep(wake_ms * tokens * others)
    return on_tick


class BusyClock:
    """The clock a backend charges through, keeping each charge's span: when the engine was in a step."""

    def __init__(self, clock) -> None:
        self._clock = clock
        self.starts: list[float] = []
        self.ends: list[float] = []

    def sleep(self, ms: float) -> None:
        start = self._clock.now()
        self._clock.sleep(ms)
        self.starts.append(start)
        self.ends.append(self._clock.now())

    def in_step(self, t_ms: float) -> bool:
        i = bisect_right(self.starts, t_ms) - 1
        return i >= 0 and t_ms < self.ends[i]

    def idle_for(self, t_ms: float) -> float:
        """How long the engine had been out of a step at `t_ms` (inf before its first)."""
        i = bisect_right(self.starts, t_ms) - 1
        return max(t_ms - self.ends[i], 0.0) if i >= 0 else float("inf")

    def __getattr__(self, name: str):
        return getattr(self._clock, name)


class FrontendArrivals(Arrivals):
    """Open-loop arrivals (already `frontend_ms` after their `sends_ms`) whose frontend takes longer
    by the engine's state at the send: `busy_ms` more when the engine was in a step (a frontend on
    the engine's core waits for it), `idle_wake` (an idle_table, base.idle_extra_ms) more after the
    engine had sat idle (a server gone cold: its first request after 20 ms idle took 1.1 ms more
    than one sent straight after another, on llama-server). The head's arrival is decided once the
    steps up to its send are charged. Requests keep their send order (one frontend queue: none
    overtakes an earlier one)."""

    def __init__(self, requests: Iterable[Request], sends_ms: Mapping[str, float], steps: BusyClock,
                 busy_ms: float = 0.0, idle_wake: Sequence[tuple[float, float]] = ()) -> None:
        self.sends_ms, self.steps, self.busy_ms, self.idle_wake = sends_ms, steps, busy_ms, tuple(idle_wake)
        super().__init__(requests)

    def _extra(self, request: Request) -> float:
        send = self.sends_ms[request.id]
        if self.steps.in_step(send):
            return self.busy_ms
        return idle_extra_ms(self.idle_wake, self.steps.idle_for(send))

    def next_ms(self) -> float:
        head = self._heap[0][2]
        return head.arrival_ms + self._extra(head)

    def pop(self) -> Request:
        request = self._heap[0][2]
        request.arrival_ms += self._extra(request)
        return super().pop()
