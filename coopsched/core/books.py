"""The books: what a committed tick leaves behind once the model's output is appended.

The yield flag, the slot, HOL waits, classic rows joining the batch, finished requests
finalized, the tick's events stamped and its counter deltas. The scheduler holds one Books,
hands it the collaborators it shares, and collects the tick's early events and counts into it.
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import SchedulerConfig
from .hol import HolBook
from .kv import KVSlotPool
from .observability import BatchObservability
from .plan import Committed, Plan, Result
from .policy import SchedulerView, TickPolicy, next_yield_flag
from .prefill import book_prefill
from .queue import PrefillQueue
from .request import Request, RequestState
from .rotation import Backlog
from .spec import SpecJob
from .types import (
    ActionKind,
    BurstFinalized,
    FinishReason,
    RequestOutcome,
    TickDeltas,
    TickKind,
    TickRecord,
    TokenEvent,
)

SPEC_PREFILLS = frozenset({TickKind.SLICE0, TickKind.WINDOW, TickKind.CHUNK})
CLASSIC_PREFILLS = (TickKind.ADMIT, TickKind.CHUNK, TickKind.MIXED)  # without a job: classic rows were prefilled
SERVES_BATCH = frozenset({ActionKind.DECODE, ActionKind.FUSED, ActionKind.MIXED})  # the decode rows got a token
NO_DELTAS = TickDeltas()


class Books:
    def __init__(self, config: SchedulerConfig, policy: TickPolicy, requests: dict[str, Request],
                 queue: PrefillQueue, kv: KVSlotPool, backlog: Backlog, hol: HolBook, obs: BatchObservability,
                 jobs: dict[str, SpecJob], running: list[Request], prefilling: list[Request],
                 cancelled: dict[str, Request]) -> None:
        self.config, self.policy, self.requests = config, policy, requests
        self.queue, self.kv, self.backlog, self.hol, self.obs = queue, kv, backlog, hol, obs
        self.jobs, self.running, self.prefilling, self.cancelled = jobs, running, prefilling, cancelled
        self.last_was_spec = False
        self.last_was_prefill = False            # a prefill ran since the decode rows were last served
        self.events: list[TokenEvent] = []       # the tick's events made before its books (reaped, stopped)
        self.num_early = 0                       # ... of which this many still need the tick's end time
        self.counts = [0, 0, 0]                  # the tick's rounds, drafts and accepted drafts

    def add_early(self, event: TokenEvent) -> None:
        """An event made before the tick's model work ended (a stop, an abort): it takes the tick's end."""
        self.events.append(event)
        self.num_early += 1

    def count_rounds(self, rows: int, drafted: int, accepted: int) -> None:
        counts = self.counts
        counts[0] += rows
        counts[1] += drafted
        counts[2] += accepted

    def book(self, plan: Plan, result: Result, start_ms: float, end_ms: float, touched: tuple[str, ...],
             rewinds: list[tuple[str, int]], releases: list[str], job: SpecJob | None, is_burst: bool,
             view: SchedulerView) -> tuple[Committed, SpecJob | None]:
        """The tick's `Committed`, and the job that holds the slot after it (`view`: for the policy)."""
        self._book_flags(plan)
        error = result.error
        kind, ids = (TickKind.ERROR, touched) if error else (plan.kind, plan.seq_ids)
        record = TickRecord(start_ms, end_ms, plan.action, kind, ids,
                            plan.prefill_tokens if kind is TickKind.CHUNK or kind is TickKind.MIXED else ())
        spec_rows: Sequence[str] = ()
        if plan.job_ids:
            job_ids = plan.job_ids
            spec_rows = ([i for i in touched if i in job_ids] if error else
                         job_ids if plan.action is ActionKind.PREFILL else
                         tuple(job.last_worked if job is not None else []))
            job = self._book_job(job, error is None)
        self.policy.observe(plan, spec_rows, record, view)
        num_waiting = self._book_hol(plan, spec_rows, error is None, touched, end_ms - start_ms)
        if not plan.job_ids and plan.kind in CLASSIC_PREFILLS:
            book_prefill([self.requests[row.seq_id] for row in plan.prefills], self.running, self.prefilling)
        events = self._take_events(end_ms, is_burst, releases)
        deltas = self._book_deltas(spec_rows, num_waiting)
        if self.policy.follows_upstream and plan.state.has_chunked_prefill and plan.state.num_running:
            deltas = self._book_chunk_counts(plan, deltas)
        return Committed(record, events, deltas, plan, rewinds, releases), job

    def _take_events(self, end_ms: float, is_burst: bool, releases: list[str]) -> list[TokenEvent]:
        """The tick's events, stamped with its end; finished requests are finalized first (in the
        order they finished), a burst's tokens merge into one event per request."""
        events, self.events = self.events, []
        early, self.num_early = (len(events) if is_burst else self.num_early), 0
        for event in events[:early] if early else ():
            event.time_ms = end_ms
        outcomes: dict[str, RequestOutcome] = {}
        for event in events:
            if event.finish_reason is not None and event.seq_id not in outcomes:
                outcomes[event.seq_id] = self._finalize(self.requests[event.seq_id])
                releases.append(event.seq_id)
        if is_burst:
            events = merge_events(events)
        if outcomes:
            for event in events:
                if event.finish_reason is not None:
                    event.outcome = outcomes[event.seq_id]
        return events

    def _book_deltas(self, spec_rows: Sequence[str], num_waiting: int) -> TickDeltas:
        """The speculative counters and the HOL waits the tick ended, into the books and its deltas."""
        rounds, drafted, accepted = self.counts
        if not (spec_rows or rounds or self.hol.samples):
            return NO_DELTAS  # a classic tick that ended no wait adds nothing
        self.counts = [0, 0, 0]
        obs = self.obs
        obs.rounds += rounds
        obs.drafted_tokens += drafted
        obs.accepted_tokens += accepted
        samples = self.hol.take_samples()
        if samples:
            obs.add_hol_waits(samples)
        return TickDeltas(rounds, drafted, accepted, int(bool(spec_rows)), tuple(samples), num_waiting)

    def _book_chunk_counts(self, plan: Plan, deltas: TickDeltas) -> TickDeltas:
        """A chunk beside decode rows: a grant (a Prefill that took the tick), or a mixed step."""
        if plan.action is ActionKind.PREFILL:
            self.obs.prefill_grants += 1
            return deltas._replace(prefill_grants=1)
        if plan.action is ActionKind.MIXED:
            self.obs.mixed_steps += 1
            return deltas._replace(mixed_steps=1)
        return deltas

    def _book_flags(self, plan: Plan) -> None:
        """The yield flag (upstream's rule: a Prefill clears it). The first chunk of a chunked slice 0
        (beyond upstream, which prefills a slice 0 whole) is speculative work and sets it, so a classic
        gap holds one chunk of it; fused and cost modes' own rule: with chunking a prefill is one piece
        of a classic gap, not its end, so with decode rows waiting it keeps the flag. A burst is no
        piece of a gap."""
        action = plan.action
        flag = next_yield_flag(self.last_was_spec, action)
        is_prefill = action is ActionKind.PREFILL
        if is_prefill and self.config.is_chunked:
            is_spec_prefill = plan.kind in SPEC_PREFILLS and bool(plan.job_ids)
            if self.policy.follows_upstream:
                flag = flag or (is_spec_prefill and plan.kind is TickKind.CHUNK)
            else:
                flag = is_spec_prefill or (self.last_was_spec and plan.state.num_running > 0)
        self.last_was_spec = flag
        if action in SERVES_BATCH:
            self.last_was_prefill = False
        elif is_prefill and plan.prefills and plan.kind is not TickKind.BURST:
            self.last_was_prefill = True

    def _book_job(self, job: SpecJob | None, ok: bool) -> SpecJob | None:
        """The served job leaves the slot when done, or parks when its grant expired (rotation)."""
        if job is None or not job.live_rows:
            return None
        if (ok and self.config.grant_rounds > 0 and len(self.backlog) > 0
                and not job.is_window and job.grant_slices >= self.config.grant_rounds):
            for request in job.rows:
                request.state = RequestState.PARKED
            self.backlog.park(job)
            self.obs.log_grant("park:" + ",".join(job.ids))
            return None
        return job

    def _book_hol(self, plan: Plan, spec_rows: Sequence[str], ok: bool, touched: tuple[str, ...],
                  wall: float) -> int:
        """HOL waits of this tick; returns how many classic rows waited on its speculative work."""
        hol = self.hol
        if not spec_rows:  # a classic tick ends every wait; a park (bookkeeping: nobody served) none
            if plan.action is not ActionKind.IDLE and plan.kind is not TickKind.PARK and hol.has_waits:
                hol.end_queue_wait(len(self.queue))
                hol.end_batch_wait(len(self.running))
            return 0
        batch_served = plan.action is ActionKind.FUSED and ok
        num_batch = 0 if batch_served else len(self.running)
        if num_batch and touched:  # a failed tick's rows (the batch's, if fused) did not wait
            num_batch = sum(r.id not in touched for r in self.running)
        num_waiting = len(self.queue) + num_batch
        self.obs.slices += 1
        self.obs.hol_waiters_max = max(self.obs.hol_waiters_max, num_waiting)
        jobs = self.jobs
        for seq_id in spec_rows:
            stats = jobs[seq_id].stats[seq_id]
            stats.slices += 1
            stats.wall_ms = max(stats.wall_ms, wall)
            stats.active_ms += wall
            stats.hol_waiters = max(stats.hol_waiters, num_waiting)
        hol.spec_tick(wall, batch_waits=not batch_served)
        if batch_served:
            hol.end_batch_wait(len(self.running))
        return num_waiting

    def _finalize(self, request: Request) -> RequestOutcome:
        if request in self.running:  # a batch row that failed
            self.running.remove(request)
            self.hol.leave_batch()
        elif request in self.prefilling:  # its prefill failed
            self.prefilling.remove(request)
        self.kv.release(request.id)
        del self.requests[request.id]
        self.cancelled.pop(request.id, None)
        job = self.jobs.pop(request.id, None)
        burst = None
        if job is not None and job.is_begun:
            burst = BurstFinalized.of(request.id, job.stats[request.id], len(request.output_token_ids))
            self.obs.add_burst(burst)
        reason = request.finish_reason or FinishReason.STOP
        return RequestOutcome(reason, request.served_speculatively, burst, request.error)


def merge_events(events: list[TokenEvent]) -> list[TokenEvent]:
    """One event per request per tick: a legacy burst streams as one lump."""
    merged: dict[str, TokenEvent] = {}
    for e in events:
        prev = merged.get(e.seq_id)
        if prev is None:
            merged[e.seq_id] = e
        else:
            prev.token_ids += e.token_ids
            prev.finish_reason = e.finish_reason or prev.finish_reason
    return list(merged.values())
