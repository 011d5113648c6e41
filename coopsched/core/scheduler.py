"""The scheduler: state, a plan per tick, and the books.

`schedule()` asks the mode's policy for one action and plans it as a message; the executor
runs it; `commit(plan, result, start_ms, end_ms, arrivals)` appends what the model produced,
keeps the books and says what the executor must rewind and release. No model, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial

from .admission import Admission
from .append import Vocab
from .config import SchedulerConfig
from .dispatch import shape_key
from .hol import HolBook
from .kv import KVSlotPool
from .modes import make_policy
from .observability import BatchObservability
from .outputs import append_prefills, append_result, fail_rows
from .plan import Committed, Decode, Plan, Result, Verify
from .policy import Decision, next_yield_flag
from .prefill import Budget, book_prefill, planned_tokens, slice0_spans, spans_for
from .queue import PrefillQueue
from .request import Request, RequestError, RequestState
from .rotation import Backlog
from .spec import SpecJob
from .types import (
    ActionKind,
    BurstFinalized,
    FinishReason,
    RequestOutcome,
    SpecStats,
    TickDeltas,
    TickKind,
    TickRecord,
    TickState,
    TokenEvent,
)

SPEC_PREFILLS = frozenset({TickKind.SLICE0, TickKind.WINDOW, TickKind.CHUNK})
CLASSIC_PREFILLS = (TickKind.ADMIT, TickKind.CHUNK, TickKind.MIXED)  # without a job: classic rows were prefilled
SERVES_BATCH = frozenset({ActionKind.DECODE, ActionKind.FUSED, ActionKind.MIXED})  # the decode rows got a token
NO_DELTAS = TickDeltas()
WAITER_CANCELLED = "Request cancelled while waiting for the speculative slice slot"


class Scheduler:
    def __init__(self, config: SchedulerConfig, *, keep_history: bool = True, vocab: Vocab | None = None) -> None:
        self.config = config
        self.policy = make_policy(config.mode, config)
        self.vocab = vocab                       # the stop rules' EOS and detokenizer (the engine gives its backend's)
        self.queue = PrefillQueue(partial(shape_key, ragged=config.enable_ragged) if config.enable_batch else None)
        self.running: list[Request] = []
        self.prefilling: list[Request] = []      # classic rows admitted, prompts not yet all prefilled
        self.job: SpecJob | None = None
        self.backlog = Backlog(config.backlog_cap, config.skip_cap)
        self.kv = KVSlotPool(config.num_kv_slots, config.slot_tokens)
        self.obs = BatchObservability(keep_history)
        self.last_was_spec = False
        self.last_was_prefill = False            # a prefill ran since the decode rows were last served
        self.decode_ticks = 0                    # the grant counter (upstream's rule), set where it is decided
        self.requests: dict[str, Request] = {}   # every live request, by id
        self._jobs: dict[str, SpecJob] = {}      # speculative request id -> its job
        self._cancelled: dict[str, Request] = {}  # live and flagged, in the order flagged
        self._hol = HolBook()
        self.admission = Admission(config, self.queue, self.kv, self.backlog, self._hol, self.obs, self._jobs,
                                   self.running, self.prefilling, self.policy.keeps_slot,
                                   self.policy.follows_upstream)
        self._events: list[TokenEvent] = []      # the tick's events made before its commit (reaped, stopped)
        self._num_early = 0                      # ... of which this many still need the tick's end time
        self._counts = [0, 0, 0]                 # the tick's rounds, drafts and accepted drafts

    # -- intake ---------------------------------------------------------------
    def validate(self, request: Request) -> None:
        """Raise RequestError if the request can never be queued now."""
        if not request.prompt_token_ids:
            raise RequestError(f"request {request.id!r}: the prompt is empty; send at least one token")
        if request.id in self.requests:
            raise RequestError(f"request id {request.id!r} is already live")
        self.kv.check_fits(request)

    def submit(self, request: Request) -> None:
        """Queue a request between ticks (one that arrived during a tick goes to that tick's commit)."""
        self.validate(request)
        self._enqueue(request, 0.0)

    def _enqueue(self, request: Request, into_tick_ms: float) -> None:
        request.state = RequestState.WAITING
        self.requests[request.id] = request
        self.queue.push(request)
        self._hol.join_queue(request.id, into_tick_ms)

    def cancel(self, seq_id: str) -> bool:
        """Flag a live request; it stops at its next round or decode step."""
        request = self.requests.get(seq_id)
        if request is None or request.is_finished:
            return False
        request.is_cancelled = True
        self._cancelled[seq_id] = request
        return True

    def fail(self, seq_id: str, error: str) -> None:
        """A model call failed for a live request after its tick's commit (a rewind): it ends with
        the error where a cancel would stop it, before its next model work."""
        request = self.requests.get(seq_id)
        if request is not None and self.cancel(seq_id):
            request.error = error

    @property
    def has_work(self) -> bool:
        return bool(self.requests) or bool(self._events)

    @property
    def has_spec_work(self) -> bool:
        return self.job is not None or len(self.backlog) > 0

    @property
    def is_idle(self) -> bool:
        """Nothing to do until something arrives (cancelled requests still to reap are work)."""
        # decide_action's Idle: no speculative work, no batch, nothing admissible
        return not (self._events or self._cancelled or self.running or self.prefilling or self.has_spec_work
                    or (len(self.queue) and self.kv.num_free))

    def spec_stats(self, seq_id: str) -> SpecStats | None:
        job = self._jobs.get(seq_id)
        return job.stats[seq_id] if job is not None else None

    def tick_state(self) -> TickState:
        has_spec_work = self.job is not None or len(self.backlog) > 0
        num_running, max_batch_size = len(self.running), self.config.max_batch_size
        num_queued, num_free_slots = len(self.queue), self.kv.num_free
        num_admitted = num_running + len(self.prefilling)  # prefilling rows join the batch when done
        num_admissible = num_queued if num_free_slots and num_admitted < max_batch_size else 0
        chunked = self.config.is_chunked
        upcoming = (self.job or self.backlog.next_grant()) if chunked else None  # the next speculative job
        return TickState(has_spec_work, num_running, max_batch_size, num_admissible, bool(self.prefilling),
                         self.last_was_spec, num_queued, num_free_slots, chunked and self.last_was_prefill,
                         upcoming is not None and not upcoming.is_begun, self.decode_ticks)

    # -- planning -------------------------------------------------------------
    def schedule(self) -> Plan:
        if self._cancelled:
            self._reap_cancelled()
        state = self.tick_state()
        decision = self.policy.decide(state, self)
        self.decode_ticks = decision.decode_ticks  # the counter rides with the choice: no one sets it apart
        action = decision.action
        if action is ActionKind.DECODE:
            rows = self.running[: state.max_batch_size]
            decodes: tuple[Decode, ...] = tuple([(r.id, r.last_token) for r in rows])  # type: ignore[misc]
            return Plan(action, TickKind.DECODE, state, tuple([r.id for r in rows]), (), decodes)
        if action is ActionKind.MIXED:
            return self._plan_mixed(state)
        if action is ActionKind.PREFILL:
            plan, job = self.admission.plan(state, slot_busy=self.has_spec_work)
            if job is not None:
                self.job = job
            return plan
        if action is ActionKind.SPEC_ROUND or action is ActionKind.FUSED:
            return self._plan_spec(decision, state)
        return Plan(ActionKind.IDLE, TickKind.IDLE, state)

    def _plan_mixed(self, state: TickState) -> Plan:
        """The decode rows and one chunk of the chunked prompt(s), in one forward."""
        rows = self.running[: state.max_batch_size]
        decodes: tuple[Decode, ...] = tuple([(r.id, r.last_token) for r in rows])  # type: ignore[misc]
        spans = tuple(spans_for(self.prefilling, Budget(self.config.prefill_chunk_tokens, len(self.prefilling))))
        ids = tuple([r.id for r in rows] + [s.seq_id for s in spans])
        return Plan(ActionKind.MIXED, TickKind.MIXED, state, ids, spans, decodes,
                    prefill_tokens=planned_tokens(spans, ids))

    def _plan_spec(self, decision: Decision, state: TickState) -> Plan:
        job, granted = self.job, False
        if job is None:
            if not len(self.backlog):
                raise RuntimeError("a speculative action was planned with no job and an empty backlog")
            job = self.job = self._grant()
            if job is None:  # every entry the grants popped was a cancelled waiter: aborted, nothing to run
                return Plan(ActionKind.IDLE, TickKind.IDLE, state)
            granted = True
        live = tuple([r.id for r in job.live_rows])  # a window's finished rows are not in this tick
        if not job.is_begun:  # slice 0 is a prefill: it never shares a fused forward
            kind, spans = slice0_spans(job, self.config.prefill_chunk_tokens, TickKind.SLICE0)
            planned = planned_tokens(spans, live) if kind is TickKind.CHUNK else ()
            if kind is TickKind.CHUNK:  # cancelled rows stop before the chunk (their spans were planned)
                self._stop(job.stop_cancelled())
                spans = tuple([s for s in spans if not self.requests[s.seq_id].is_finished])
            job.start_slice0()
            return Plan(ActionKind.SPEC_ROUND, kind, state, live, spans, job_ids=live,
                        prefill_batched=kind is TickKind.CHUNK, prefill_tokens=planned)
        if decision.block_size is not None:
            job.block_size = decision.block_size
        verifies = self._start_round(job)
        if decision.action is ActionKind.FUSED:
            rows = self.running[: self.config.max_batch_size]
            decodes: tuple[Decode, ...] = tuple([(r.id, r.last_token) for r in rows])  # type: ignore[misc]
            return Plan(ActionKind.FUSED, TickKind.FUSED, state, tuple(r.id for r in rows) + tuple(job.ids), (),
                        decodes, verifies, live)
        return Plan(ActionKind.SPEC_ROUND, TickKind.GRANT if granted else TickKind.ROUND, state, live, (), (),
                    verifies, live)

    def _grant(self) -> SpecJob | None:
        """The next grantee. Upstream's rule pops a cancelled waiter at its grant (a grant decision: the
        others count a skip) and aborts it with an error event; a cancelled parked job is granted and
        stops at its round's top, as an active job does."""
        while (job := self.backlog.grant()) is not None:
            if job.is_begun or not all(r.is_cancelled or r.is_finished for r in job.rows):
                self.obs.log_grant(",".join(job.ids))
                return job
            self.obs.log_grant("drop:" + ",".join(job.ids))
            for request in job.rows:
                if not request.is_finished:
                    request.state, request.finish_reason = RequestState.FINISHED, FinishReason.ERROR
                    request.error = WAITER_CANCELLED
                    self._events.append(TokenEvent(request.id, (), 0.0, FinishReason.ERROR))
                    self._num_early += 1
        return None

    def next_round(self, plan: Plan) -> Plan:
        """The next round of a burst, inside the tick `plan` began (its kind, ids and state)."""
        assert self.job is not None, "a burst continues only while its job holds the slot"
        return plan._replace(prefills=(), verifies=self._start_round(self.job))

    def _start_round(self, job: SpecJob) -> tuple[Verify, ...]:
        """Cancelled rows stop before the round; the others each verify K positions."""
        stopped, rows = job.start_round()
        self._stop(stopped)
        k = job.block_size
        return tuple([Verify(r.id, r.last_token, k) for r in rows])  # type: ignore[arg-type]

    def _stop(self, seq_ids: Iterable[str]) -> None:
        """Finish events of rows stopped before the tick's model work (cancelled, or failed)."""
        for seq_id in seq_ids:
            self._events.append(TokenEvent(seq_id, (), 0.0, self.requests[seq_id].finish_reason))
            self._num_early += 1

    # -- commit ---------------------------------------------------------------
    def commit(self, plan: Plan, result: Result, start_ms: float, end_ms: float,
               arrivals: Sequence[Request] = ()) -> Committed:
        """Book one run of the plan: `arrivals` came during the tick (validated; they waited on it from
        their arrival_ms). A burst's commit `continues` the tick until the request ends."""
        for request in arrivals:
            self._enqueue(request, request.arrival_ms - start_ms)
        rewinds: list[tuple[str, int]] = []
        releases: list[str] = []
        touched: tuple[str, ...] = ()
        if result.error is None:
            self._append(plan, result, end_ms, rewinds)
            job = self.job
            if plan.job_ids and job is not None and self._keeps_slot(plan) and job.live_rows:
                record = TickRecord(start_ms, end_ms, plan.action, plan.kind, plan.seq_ids)
                return Committed(record, [], NO_DELTAS, plan, rewinds, [], continues=True)
        else:
            if not plan.job_ids and result.firsts:  # a mixed tick's chunk ran before its decode failed
                assert self.vocab is not None, "the scheduler needs the model's vocab to commit (Engine gives it)"
                append_prefills(plan, result, self.requests, self.vocab, end_ms, self._events, result.failed)
            touched = self._fail(plan, result, releases)
        return self._book(plan, result, start_ms, end_ms, touched, rewinds, releases)

    def _keeps_slot(self, plan: Plan) -> bool:
        """A burst keeps the slot: its next round runs inside this tick (the policy chose BURST)."""
        return plan.kind is TickKind.BURST

    def _append(self, plan: Plan, result: Result, end_ms: float, rewinds: list[tuple[str, int]]) -> None:
        assert self.vocab is not None, "the scheduler needs the model's vocab to commit (Engine gives it)"
        rows, drafted, accepted = append_result(plan, result, self.requests, self.job if plan.job_ids else None,
                                                self.vocab, end_ms, self._events, rewinds)
        if rows:
            counts = self._counts
            counts[0] += rows
            counts[1] += drafted
            counts[2] += accepted

    def _fail(self, plan: Plan, result: Result, releases: list[str]) -> tuple[str, ...]:
        num_events = len(self._events)
        touched = fail_rows(plan, result, self.requests, self.job if plan.job_ids else None, self._events, releases)
        self._num_early += len(self._events) - num_events  # finish events, stamped with the tick's end
        return touched

    # -- the books ------------------------------------------------------------
    def _book(self, plan: Plan, result: Result, start_ms: float, end_ms: float, touched: tuple[str, ...],
              rewinds: list[tuple[str, int]], releases: list[str]) -> Committed:
        self._book_flags(plan)
        error = result.error
        kind, ids = (TickKind.ERROR, touched) if error else (plan.kind, plan.seq_ids)
        record = TickRecord(start_ms, end_ms, plan.action, kind, ids,
                            plan.prefill_tokens if kind is TickKind.CHUNK or kind is TickKind.MIXED else ())
        spec_rows: Sequence[str] = ()
        if plan.job_ids:
            job_ids = plan.job_ids
            spec_rows = ([i for i in touched if i in job_ids] if error else
                         job_ids if plan.action is ActionKind.PREFILL else tuple(self._job_worked()))
            self._book_job(error is None)
        self.policy.observe(plan, spec_rows, record, self)
        num_waiting = self._book_hol(plan, spec_rows, error is None, touched, end_ms - start_ms)
        if not plan.job_ids and plan.kind in CLASSIC_PREFILLS:
            book_prefill([self.requests[row.seq_id] for row in plan.prefills], self.running, self.prefilling)
        events = self._take_events(end_ms, bool(plan.job_ids) and self._keeps_slot(plan), releases)
        deltas = self._book_deltas(spec_rows, num_waiting)
        if self.policy.follows_upstream and plan.state.has_chunked_prefill and plan.state.num_running:
            deltas = self._book_chunk_counts(plan, deltas)
        return Committed(record, events, deltas, plan, rewinds, releases)

    def _job_worked(self) -> list[str]:
        return self.job.last_worked if self.job is not None else []

    def _take_events(self, end_ms: float, is_burst: bool, releases: list[str]) -> list[TokenEvent]:
        """The tick's events, stamped with its end; finished requests are finalized first (in the
        order they finished), a burst's tokens merge into one event per request."""
        events, self._events = self._events, []
        early, self._num_early = (len(events) if is_burst else self._num_early), 0
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
        rounds, drafted, accepted = self._counts
        if not (spec_rows or rounds or self._hol.samples):
            return NO_DELTAS  # a classic tick that ended no wait adds nothing
        self._counts = [0, 0, 0]
        obs = self.obs
        obs.rounds += rounds
        obs.drafted_tokens += drafted
        obs.accepted_tokens += accepted
        samples = self._hol.take_samples()
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

    def _book_job(self, ok: bool) -> None:
        """The served job leaves the slot when done, or parks when its grant expired (rotation)."""
        job = self.job
        if job is None:
            return
        if not job.live_rows:
            self.job = None
        elif (ok and self.config.grant_rounds > 0 and len(self.backlog) > 0
              and not job.is_window and job.grant_slices >= self.config.grant_rounds):
            for request in job.rows:
                request.state = RequestState.PARKED
            self.backlog.park(job)
            self.obs.log_grant("park:" + ",".join(job.ids))
            self.job = None

    def _book_hol(self, plan: Plan, spec_rows: Sequence[str], ok: bool, touched: tuple[str, ...],
                  wall: float) -> int:
        """HOL waits of this tick; returns how many classic rows waited on its speculative work."""
        hol = self._hol
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
        jobs = self._jobs
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

    def _reap_cancelled(self) -> None:
        """Cancelled requests leave the queue, the batch and the backlog before the next action."""
        doomed = [r for r in self._cancelled.values()
                  if r.state in (RequestState.WAITING, RequestState.RUNNING, RequestState.PREFILLING)]
        if len(self.backlog) and not self.policy.follows_upstream:  # upstream's: popped at their grant
            for job in self.backlog.drop_cancelled():
                self.obs.log_grant("drop:" + ",".join(job.ids))
                doomed += job.rows
        for request in doomed:
            if request.state is RequestState.WAITING:
                self.queue.remove(request)
                self._hol.leave_queue(request.id)
            elif request.state is RequestState.RUNNING:
                self.running.remove(request)
                self._hol.leave_batch()
            elif request.state is RequestState.PREFILLING:
                self.prefilling.remove(request)
            request.state = RequestState.FINISHED
            request.finish_reason = FinishReason.ERROR if request.error else FinishReason.STOP
            self._stop((request.id,))  # its finish event frees its caches

    def _finalize(self, request: Request) -> RequestOutcome:
        if request in self.running:  # a batch row that failed
            self.running.remove(request)
            self._hol.leave_batch()
        elif request in self.prefilling:  # its prefill failed
            self.prefilling.remove(request)
        self.kv.release(request.id)
        del self.requests[request.id]
        self._cancelled.pop(request.id, None)
        job = self._jobs.pop(request.id, None)
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
