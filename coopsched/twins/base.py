"""A server's scheduler as a twin: each step one plan over the rows it serves, one generic commit.

A kind's model decides only `plan_step()` (who prefills, decodes and verifies this step); intake,
cancellation, appending, the acceptance walk, finishing and the books are the same for every kind.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import ClassVar, NamedTuple

from coopsched.core.append import Vocab, append
from coopsched.core.config import SchedulerConfig
from coopsched.core.kv import KVSlotPool, check_queueable
from coopsched.core.observability import BatchObservability
from coopsched.core.plan import Committed, Plan, Prefill, Result
from coopsched.core.request import Request, RequestState
from coopsched.core.spec import accept_walk
from coopsched.core.types import (
    ActionKind,
    FinishReason,
    RequestOutcome,
    SpecStats,
    TickDeltas,
    TickKind,
    TickRecord,
    TickState,
    TokenEvent,
)


class Param(NamedTuple):
    """One parameter of a kind's model: its default, and the server flag or config key it mirrors."""
    name: str
    default: object
    flag: str
    meaning: str


def ms_value(kind: str, name: str, value: object) -> float:
    """A duration param of a `kind` twin in ms, or a ValueError naming it and what is accepted."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e6:
        raise ValueError(f"server_params {name}={value!r}: a {kind} twin wants a number of ms >= 0")
    return float(value)


def idle_table(kind: str, name: str, value: object) -> tuple[tuple[float, float], ...]:
    """A table param of `[idle ms, extra ms]` pairs, idle rising, or a ValueError naming it."""
    try:
        table = tuple((ms_value(kind, name, idle), ms_value(kind, name, extra))
                      for idle, extra in value)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        table = None
    if table is None or any(b[0] <= a[0] for a, b in pairwise(table)):
        raise ValueError(f"server_params {name}={value!r}: a {kind} twin wants [idle ms, extra ms] pairs, "
                         "idle ms rising, e.g. [[5, 0.4], [20, 1.1]]")
    return table


def idle_extra_ms(table: Sequence[tuple[float, float]], idle_ms: float) -> float:
    """The extra of an `idle_table` after `idle_ms` idle: 0 at no idle, linear between its points,
    its last beyond them."""
    points = [(0.0, 0.0), *table] if table and table[0][0] > 0 else list(table)
    i = bisect_right(points, (idle_ms, float("inf")))
    if i == 0 or i == len(points):
        return points[-1][1] if i else 0.0
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (idle_ms - x0) / (x1 - x0)


class StepModel:
    """The Engine's scheduler surface for a server that runs one forward per step over its rows."""
    kind: ClassVar[str] = ""
    PARAMS: ClassVar[tuple[Param, ...]] = ()
    frontend_ms: float = 0.0  # from a client's send to this scheduler seeing the request (the runner shifts arrivals)
    frontend_busy_ms: float = 0.0  # more frontend for a request sent while the engine is in a step (the runner adds it)
    frontend_stall_ms: float = 0.0  # engine-core time each arrival's frontend takes (the runner stretches forwards)
    wake_ms: float = 0.0  # core time a streamed token takes waking each other request's frontend (the runner charges)
    idle_wake: tuple[tuple[float, float], ...] = ()  # more frontend after the server sat idle (the runner adds it)
    draw: int = 0  # which of a twin's runs this is: a model's own draws (vLLM's proposals) are keyed by it

    def __init__(self, config: SchedulerConfig, params: Mapping[str, object] | None = None, *,
                 keep_history: bool = True, vocab: Vocab | None = None) -> None:
        self.config = config
        self.params = self.resolve(params or {})
        self.frontend_ms = self.ms_param("frontend_ms")
        self.frontend_busy_ms = self.ms_param("frontend_busy_ms")
        self.frontend_stall_ms = self.ms_param("frontend_stall_ms")
        self.wake_ms = self.ms_param("wake_ms")
        self.idle_wake = idle_table(self.kind, "idle_wake_ms", self.params.get("idle_wake_ms") or [])
        self.vocab = vocab
        self.kv = KVSlotPool(config.num_kv_slots, config.slot_tokens)
        self.obs = BatchObservability(keep_history)
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []   # arrived, not admitted, first come first
        self.running: list[Request] = []   # admitted (prefilling or decoding), in admission order
        self._stats: dict[str, SpecStats] = {}
        self._events: list[TokenEvent] = []  # finish events of rows stopped before a step (cancelled)

    @classmethod
    def resolve(cls, params: Mapping[str, object]) -> dict[str, object]:
        """The defaults overlaid with `params`; an unknown name is refused, naming the accepted ones."""
        known = {p.name: p.default for p in cls.PARAMS}
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise ValueError(f"server_params {', '.join(map(repr, unknown))} unknown for a {cls.kind} server; "
                             f"accepted: {', '.join(known) or 'none'}")
        return {**known, **params}

    def ms_param(self, name: str) -> float:
        """A duration param in ms (0 when this kind has none by that name)."""
        return ms_value(self.kind, name, self.params.get(name, 0.0))

    # -- intake ---------------------------------------------------------------
    def validate(self, request: Request) -> None:
        check_queueable(request, self.requests, self.kv)

    def submit(self, request: Request) -> None:
        self.validate(request)
        self._enqueue(request)

    def _enqueue(self, request: Request) -> None:
        request.state = RequestState.WAITING
        self.requests[request.id] = request
        self.waiting.append(request)

    def cancel(self, seq_id: str) -> bool:
        request = self.requests.get(seq_id)
        if request is None or request.is_finished:
            return False
        request.is_cancelled = True
        return True

    def fail(self, seq_id: str, error: str) -> None:
        request = self.requests.get(seq_id)
        if request is not None and self.cancel(seq_id):
            request.error = error

    @property
    def has_work(self) -> bool:
        return bool(self.requests) or bool(self._events)

    @property
    def is_idle(self) -> bool:
        return not (self._events or self.running or (self.waiting and self.kv.num_free)
                    or any(r.is_cancelled for r in self.waiting))  # a cancelled waiter is still to stop

    def spec_stats(self, seq_id: str) -> SpecStats | None:
        return self._stats.get(seq_id)

    # -- what a kind's plan_step uses --------------------------------------------
    @property
    def speculates(self) -> bool:
        """A draft model (or a speculation method) is configured: the server speculates."""
        return self.config.has_drafter

    def admit(self, request: Request) -> None:
        """Waiting -> running, holding a KV slot."""
        self.waiting.remove(request)
        self.kv.acquire(request.id)
        request.state = RequestState.PREFILLING
        self.running.append(request)

    def span(self, request: Request, num_tokens: int | None = None) -> Prefill:
        """The request's next prompt positions, at most `num_tokens` (None: the rest)."""
        start = request.num_prefilled
        stop = len(request.prompt_token_ids) if num_tokens is None else min(start + num_tokens,
                                                                            len(request.prompt_token_ids))
        return Prefill(request.id, request.prompt_token_ids, start, stop, request.sampling, self.speculates)

    def state(self) -> TickState:
        decoding = sum(is_prefilled(r) for r in self.running)
        return TickState(False, decoding, self.config.max_batch_size, len(self.waiting) if self.kv.num_free else 0,
                         decoding < len(self.running), False, len(self.waiting), self.kv.num_free)

    def idle_plan(self) -> Plan:
        return Plan(ActionKind.IDLE, TickKind.IDLE, self.state())

    def plan_step(self) -> Plan:
        raise NotImplementedError(f"{type(self).__name__} must say what a step serves (plan_step)")

    # -- planning and commit ------------------------------------------------------
    def schedule(self) -> Plan:
        self._stop_cancelled()
        return self.plan_step()

    def next_round(self, plan: Plan) -> Plan:
        raise RuntimeError(f"a {self.kind} server never keeps a slot across rounds inside one step")

    def commit(self, plan: Plan, result: Result, start_ms: float, end_ms: float,
               arrivals: Sequence[Request] = ()) -> Committed:
        """Book one step: progress, tokens and the acceptance walk per row, finished rows released."""
        assert self.vocab is not None, "the model needs the backend's vocab to commit (Engine gives it)"
        for request in arrivals:
            self._enqueue(request)
        events, self._events = self._events, []
        for event in events:
            event.time_ms = end_ms
        rewinds: list[tuple[str, int]] = []
        failed = result.failed if result.error is not None else ()
        self._append_prefills(plan, result, failed, end_ms, events)
        counts = self._append_tokens(plan, result, end_ms, events, rewinds) if result.error is None else (0, 0, 0)
        for seq_id in failed:  # a failed call ends its rows with the error; the others carry on
            row = self.requests.get(seq_id)
            if row is not None and not row.is_finished:
                row.state, row.finish_reason, row.error = RequestState.FINISHED, FinishReason.ERROR, result.error
                events.append(TokenEvent(seq_id, (), end_ms, FinishReason.ERROR))
        releases = self._finish(events)
        kind, ids = (TickKind.ERROR, failed) if result.error is not None else (plan.kind, plan.seq_ids)
        record = TickRecord(start_ms, end_ms, plan.action, kind, ids,
                            plan.prefill_tokens if kind in (TickKind.CHUNK, TickKind.MIXED) else ())
        self.obs.rounds += counts[0]
        self.obs.drafted_tokens += counts[1]
        self.obs.accepted_tokens += counts[2]
        self.obs.slices += bool(counts[0])
        deltas = TickDeltas(*counts, slices=int(bool(counts[0]))) if counts[0] else TickDeltas()
        rewinds = [(seq_id, n) for seq_id, n in rewinds if seq_id not in releases]
        return Committed(record, events, deltas, plan, rewinds, releases)

    def _append_prefills(self, plan: Plan, result: Result, failed: Sequence[str], end_ms: float,
                         events: list[TokenEvent]) -> None:
        vocab = self.vocab
        assert vocab is not None
        for row, first in zip(plan.prefills, result.firsts):
            if row.seq_id in failed:
                continue
            request = self.requests[row.seq_id]
            request.num_prefilled = row.stop
            if first is not None:
                request.state = RequestState.RUNNING
                tokens, reason = append(request, (first,), vocab)
                events.append(TokenEvent(row.seq_id, tokens, end_ms, reason))

    def _append_tokens(self, plan: Plan, result: Result, end_ms: float, events: list[TokenEvent],
                       rewinds: list[tuple[str, int]]) -> tuple[int, int, int]:
        """Decodes append one token each; verifies walk acceptance. Returns (rounds, drafted, accepted)."""
        vocab = self.vocab
        assert vocab is not None
        for (seq_id, _), token in zip(plan.decodes, result.tokens):
            tokens, reason = append(self.requests[seq_id], (token,), vocab)
            events.append(TokenEvent(seq_id, tokens, end_ms, reason))
        drafted = accepted = 0
        for verify, drafts, targets in zip(plan.verifies, result.drafts, result.targets):
            request = self.requests[verify.seq_id]
            request.served_speculatively = True
            emitted, took = accept_walk(drafts, targets, request.num_remaining)
            took = min(took, len(drafts))
            stats = self._stats.setdefault(verify.seq_id, SpecStats())
            stats.rounds += 1
            stats.drafted += len(drafts)
            stats.accepted += took
            drafted, accepted = drafted + len(drafts), accepted + took
            tokens, reason = append(request, emitted, vocab)
            events.append(TokenEvent(verify.seq_id, tokens, end_ms, reason))
            if reason is None:
                rewinds.append((verify.seq_id, len(drafts) - took))
        return len(plan.verifies), drafted, accepted

    def _finish(self, events: list[TokenEvent]) -> list[str]:
        """Finished rows leave the books; their finish events carry the outcome."""
        releases = []
        for event in events:
            if event.finish_reason is None or event.seq_id in releases:
                continue
            request = self.requests.pop(event.seq_id)
            for rows in (self.running, self.waiting):
                if request in rows:
                    rows.remove(request)
            self.kv.release(request.id)
            releases.append(request.id)
            event.outcome = RequestOutcome(event.finish_reason, request.served_speculatively, None, request.error)
        return releases

    def _stop_cancelled(self) -> None:
        """Cancelled rows stop before the step's model work; their finish events go out with it."""
        for request in [r for r in (*self.waiting, *self.running) if r.is_cancelled and not r.is_finished]:
            (self.waiting if request in self.waiting else self.running).remove(request)
            request.state = RequestState.FINISHED
            request.finish_reason = FinishReason.ERROR if request.error else FinishReason.STOP
            self._events.append(TokenEvent(request.id, (), 0.0, request.finish_reason))


def is_prefilled(request: Request) -> bool:
    return request.num_prefilled >= len(request.prompt_token_ids)
