"""Admission: which queued requests a prefill tick admits, and how.

The queue head goes where `dispatch` says (a waiter, a classic row, a speculative session or
window); with chunking the prefills under way go first, within one tick's budget. The
scheduler holds one Admission and hands it the collaborators it shares.
"""

from __future__ import annotations

from .config import SchedulerConfig
from .dispatch import Route, dispatch, is_eligible
from .hol import HolBook
from .kv import KVSlotPool
from .observability import BatchObservability
from .plan import Plan
from .prefill import Budget, planned_tokens, prefill_kind, slice0_spans, spans_for
from .queue import PrefillQueue
from .request import Request, RequestState
from .rotation import Backlog
from .spec import SpecJob
from .types import ActionKind, TickKind, TickState


class Admission:
    def __init__(self, config: SchedulerConfig, queue: PrefillQueue, kv: KVSlotPool, backlog: Backlog,
                 hol: HolBook, obs: BatchObservability, jobs: dict[str, SpecJob], running: list[Request],
                 prefilling: list[Request], keeps_slot: bool) -> None:
        self.config, self.queue, self.kv, self.backlog = config, queue, kv, backlog
        self.hol, self.obs, self.jobs = hol, obs, jobs
        self.running, self.prefilling = running, prefilling
        self.keeps_slot = keeps_slot  # the policy's: a speculative admission runs whole (the legacy burst)

    def plan(self, state: TickState, slot_busy: bool) -> tuple[Plan, SpecJob | None]:
        """The prefill tick's plan, and the speculative job it starts in the slot (if any)."""
        if self.prefilling:  # a chunked prefill under way goes on first
            return self._plan_classic(state, []), None
        head = self.queue.pop()
        self.hol.leave_queue(head.id)
        limit = min(self.config.max_window - 1, self.kv.num_free - 1)
        siblings = self.queue.siblings(head, max(limit, 1)) if not slot_busy else []
        route = dispatch(head, self.config, slot_busy=slot_busy, backlog_has_room=self.backlog.has_room,
                         num_siblings=len(siblings))
        if route is Route.WAITER:
            self.kv.acquire(head.id)
            head.state = RequestState.PARKED
            self.jobs[head.id] = job = SpecJob([head], self.config.block_size)
            self.backlog.park(job)
            self.obs.waiter_parks += 1
            return Plan(ActionKind.PREFILL, TickKind.PARK, state, (head.id,)), None
        if route is Route.CLASSIC:
            self.kv.acquire(head.id)
            return self._plan_classic(state, [head]), None
        rows = [head]
        if route is Route.WINDOW:
            for sibling in siblings[: max(limit, 0)]:
                self.queue.remove(sibling)
                self.hol.leave_queue(sibling.id)
                rows.append(sibling)
        for request in rows:
            self.kv.acquire(request.id)
        job = SpecJob(rows, self.config.block_size)
        for request in rows:
            self.jobs[request.id] = job
        self.obs.log_grant(",".join(job.ids))
        return self._plan_slice0(state, job), job

    def _plan_slice0(self, state: TickState, job: SpecJob) -> Plan:
        """A new job's slice 0; a policy that keeps the slot runs the request whole (BURST), unchunked."""
        if self.keeps_slot:
            kind, spans = slice0_spans(job, 0, TickKind.BURST)
        else:
            kind, spans = slice0_spans(job, self.config.prefill_chunk_tokens,
                                       TickKind.WINDOW if job.is_window else TickKind.SLICE0)
        ids = tuple(job.ids)
        job.start_slice0()
        return Plan(ActionKind.PREFILL, kind, state, ids, spans, job_ids=ids, prefill_batched=kind is TickKind.CHUNK,
                    prefill_tokens=planned_tokens(spans, ids) if kind is TickKind.CHUNK else ())

    def _plan_classic(self, state: TickState, admitted: list[Request]) -> Plan:
        """Chunks of the prefills under way, then new classic admissions, within one tick's budget.

        Only requests that cannot be served speculatively join a batch behind the head: a
        speculative one waits to be the head of its own admission tick (queue order kept).
        """
        budget = Budget(self.config.prefill_chunk_tokens, self.config.max_batch_prefill)
        spans = spans_for([*self.prefilling, *admitted], budget)
        room = self.config.max_batch_size - len(self.running) - len(self.prefilling) - len(admitted)
        while budget.has_room and room > 0 and self.kv.num_free:
            head = self.queue.peek()
            if head is None or is_eligible(head, self.config):
                break
            self.queue.pop()
            self.hol.leave_queue(head.id)
            self.kv.acquire(head.id)
            spans.append(budget.take(head, False))
            room -= 1
        ids = tuple(s.seq_id for s in spans)
        kind = prefill_kind(spans, TickKind.ADMIT)
        return Plan(ActionKind.PREFILL, kind, state, ids, tuple(spans),
                    prefill_tokens=tuple(s.stop - s.start for s in spans) if kind is TickKind.CHUNK else ())
