"""A frontend sharing the engine's core: each arrival's frontend work holds the core from its send,
and a forward that overlaps it finishes that much later (the frontend first: its work is short and
the OS schedules the waking process), computed from the open-loop send times alone."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable


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
