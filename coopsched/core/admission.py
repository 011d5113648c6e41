"""Admission planning: which queued requests a prefill tick admits, and how.

Part of the Scheduler (a base class, so planning reads in one screen): the queue head goes
where `dispatch` says (a waiter, a classic row, a speculative session or window, or the
legacy burst), and with chunking on the prefills under way go first, within one tick's budget.
"""

from __future__ import annotations

from .config import SchedulerConfig
from .dispatch import Route, dispatch, is_eligible
from .hol import HolBook, Samples
from .kv import KVSlotPool
from .observability import BatchObservability
from .plan import Plan
from .policy import TickPolicy
from .prefill import Budget, prefill_kind, slice0_spans, spans_for
from .queue import PrefillQueue
from .request import Request, RequestState
from .rotation import Backlog
from .spec import SpecJob
from .types import ActionKind, TickKind, TickState


class Admissions:
    """The Scheduler's admission planning; the Scheduler owns every attribute below."""
    config: SchedulerConfig
    policy: TickPolicy
    queue: PrefillQueue
    running: list[Request]
    prefilling: list[Request]
    job: SpecJob | None
    backlog: Backlog
    kv: KVSlotPool
    obs: BatchObservability
    _jobs: dict[str, SpecJob]
    _hol: HolBook
    _hol_samples: Samples

    @property
    def has_spec_work(self) -> bool:
        return self.job is not None or len(self.backlog) > 0

    def _plan_admission(self, state: TickState, release: tuple[str, ...]) -> Plan:
        if self.prefilling:  # a chunked prefill under way goes on first (upstream: nothing else joins it)
            return self._plan_classic_prefill(state, release, [], admit=not self.policy.follows_upstream)
        head = self.queue.pop()
        self._hol_samples += self._hol.leave_queue(head.id)
        slot_free = not self.has_spec_work
        limit = min(self.config.max_window - 1, self.kv.num_free - 1)
        siblings = self.queue.siblings(head, max(limit, 1)) if slot_free else []
        route = dispatch(head, self.config, slot_busy=not slot_free, backlog_has_room=self.backlog.has_room,
                         num_siblings=len(siblings))
        if route is Route.WAITER:
            self.kv.acquire(head.id)
            head.state = RequestState.PARKED
            self._jobs[head.id] = job = SpecJob([head], self.config.block_size)
            self.backlog.park(job)
            self.obs.waiter_parks += 1
            return Plan(ActionKind.PREFILL, TickKind.PARK, state, (head.id,), job=job, release=release)
        if route is Route.CLASSIC:
            self.kv.acquire(head.id)
            return self._plan_classic_prefill(state, release, [head])
        rows = [head]
        if route is Route.WINDOW:
            for sibling in siblings[: max(limit, 0)]:
                self.queue.remove(sibling)
                self._hol_samples += self._hol.leave_queue(sibling.id)
                rows.append(sibling)
        for request in rows:
            self.kv.acquire(request.id)
        self.job = job = SpecJob(rows, self.config.block_size)
        for request in rows:
            self._jobs[request.id] = job
        self.obs.log_grant(",".join(job.ids))
        if not self.policy.is_sliced:
            return Plan(ActionKind.PREFILL, TickKind.BURST, state, tuple(job.ids), job=job, release=release)
        kind, spans = slice0_spans(job, self.config.prefill_chunk_tokens,
                                   TickKind.WINDOW if job.is_window else TickKind.SLICE0)
        return Plan(ActionKind.PREFILL, kind, state, tuple(job.ids), job=job, release=release, spans=spans)

    def _plan_classic_prefill(self, state: TickState, release: tuple[str, ...], admitted: list[Request],
                              admit: bool = True) -> Plan:
        """Chunks of the prefills under way, then new classic admissions, within one tick's budget.

        Only requests that cannot be served speculatively join a batch behind the head: a
        speculative one waits to be the head of its own admission tick (queue order kept).
        """
        budget = Budget(self.config.prefill_chunk_tokens, self.config.max_batch_prefill)
        spans = spans_for([*self.prefilling, *admitted], budget)
        room = self.config.max_batch_size - len(self.running) - len(self.prefilling) - len(admitted)
        while admit and budget.has_room and room > 0 and self.kv.num_free:
            head = self.queue.peek()
            if head is None or is_eligible(head, self.config):
                break
            self.queue.pop()
            self._hol_samples += self._hol.leave_queue(head.id)
            self.kv.acquire(head.id)
            spans.append(budget.take(head))
            room -= 1
        rows = tuple(s.request for s in spans)
        return Plan(ActionKind.PREFILL, prefill_kind(spans, TickKind.ADMIT), state, tuple(r.id for r in rows),
                    rows, release=release, spans=tuple(spans))

