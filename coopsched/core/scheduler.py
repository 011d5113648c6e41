"""The scheduler: state, a plan per tick, and the books.

Two calls and a loop: `schedule()` reaps cancels and asks the mode's policy for
one action, then plans it (which rows, which job, which K); the executor runs the
plan on a backend; `commit(plan, outcome, start_ms, end_ms)` stamps tokens with
the tick's end (when they become visible), keeps the books and returns the
tick's record, events and counter deltas. The scheduler calls no model and
reads no clock. Work per tick is proportional to the rows the tick touches.
"""

from __future__ import annotations

from functools import partial

from .admission import Admissions
from .commit import merge_emissions
from .config import SchedulerConfig
from .dispatch import shape_key
from .hol import HolBook, Samples
from .kv import KVSlotPool
from .modes import make_policy
from .observability import BatchObservability
from .plan import Plan
from .policy import Decision, next_yield_flag
from .prefill import Budget, book_prefill, prefill_tokens, slice0_spans, spans_for
from .queue import PrefillQueue
from .request import Request, RequestError, RequestState
from .rotation import Backlog
from .spec import SpecJob
from .types import (
    ActionKind,
    BurstFinalized,
    Committed,
    Emission,
    FinishReason,
    Outcome,
    RequestOutcome,
    TickDeltas,
    TickKind,
    TickRecord,
    TickState,
    TokenEvent,
)

SPEC_PREFILLS = frozenset({TickKind.SLICE0, TickKind.WINDOW, TickKind.CHUNK})
CLASSIC_PREFILLS = (TickKind.ADMIT, TickKind.CHUNK)  # without a job: classic rows were prefilled
SERVES_BATCH = frozenset({ActionKind.DECODE, ActionKind.FUSED, ActionKind.MIXED})  # the decode rows got a token
NO_DELTAS = TickDeltas()


class Scheduler(Admissions):
    def __init__(self, config: SchedulerConfig, *, keep_history: bool = True) -> None:
        self.config = config
        self.policy = make_policy(config.mode, config)
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
        self._reaped: list[Emission] = []
        self._hol = HolBook()
        self._hol_samples: Samples = []          # waits ended since the last commit

    # -- intake ---------------------------------------------------------------
    def submit(self, request: Request, into_tick_ms: float = 0.0) -> None:
        """Queue a request; `into_tick_ms` > 0: it arrived that long into the tick now being committed
        (it waited on that tick from then: its HOL wait and the tick's waiters count it)."""
        if not request.prompt_token_ids:
            raise RequestError(f"request {request.id!r}: the prompt is empty; send at least one token")
        if request.id in self.requests:
            raise RequestError(f"request id {request.id!r} is already live")
        self.kv.check_fits(request)
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

    @property
    def has_work(self) -> bool:
        return bool(self.requests) or bool(self._reaped)

    @property
    def is_idle(self) -> bool:
        """Nothing to do until something arrives (cancelled requests still to reap are work)."""
        # decide_action's Idle: no speculative work, no batch, nothing admissible
        return not (self._reaped or self._cancelled or self.running or self.prefilling or self.has_spec_work
                    or (len(self.queue) and self.kv.num_free))

    def tick_state(self) -> TickState:
        # each field in a local of its name, passed in field order (keywords cost ~0.7 us a tick)
        has_spec_work = self.job is not None or len(self.backlog) > 0
        num_running, max_batch_size = len(self.running), self.config.max_batch_size
        num_queued, num_free_slots = len(self.queue), self.kv.num_free
        num_admitted = num_running + len(self.prefilling)  # prefilling rows join the batch when done
        num_admissible = num_queued if num_free_slots and num_admitted < max_batch_size else 0
        has_parked_prefill = bool(self.prefilling)
        chunked = self.config.is_chunked
        prefill_yields = chunked and self.last_was_prefill
        upcoming = (self.job or self.backlog.next_grant()) if chunked else None  # the next speculative job
        spec_prefilling = upcoming is not None and not upcoming.is_begun
        return TickState(has_spec_work, num_running, max_batch_size, num_admissible, has_parked_prefill,
                         self.last_was_spec, num_queued, num_free_slots, prefill_yields, spec_prefilling,
                         self.decode_ticks)

    # -- planning -------------------------------------------------------------
    def schedule(self) -> Plan:
        if self._cancelled:
            self._reap_cancelled()
        state = self.tick_state()
        decision = self.policy.decide(state, self)
        self.decode_ticks = decision.decode_ticks  # the counter rides with the choice: no one sets it apart
        release = tuple(e.seq_id for e in self._reaped) if self._reaped else ()
        action = decision.action
        if action is ActionKind.DECODE:
            rows = tuple(self.running[: state.max_batch_size])
            return Plan(action, TickKind.DECODE, state, tuple([r.id for r in rows]), rows, release=release)
        if action is ActionKind.MIXED:
            return self._plan_mixed(state, release)
        if action is ActionKind.PREFILL:
            return self._plan_admission(state, release)
        if action is ActionKind.SPEC_ROUND or action is ActionKind.FUSED:
            return self._plan_spec(decision, state, release)
        return Plan(ActionKind.IDLE, TickKind.IDLE, state, release=release)

    def _plan_mixed(self, state: TickState, release: tuple[str, ...]) -> Plan:
        """The decode rows and one chunk of the chunked prompt(s), in one forward."""
        rows = tuple(self.running[: state.max_batch_size])
        spans = tuple(spans_for(self.prefilling, Budget(self.config.prefill_chunk_tokens, len(self.prefilling))))
        ids = tuple([r.id for r in rows] + [s.request.id for s in spans])
        return Plan(ActionKind.MIXED, TickKind.MIXED, state, ids, rows, release=release, spans=spans)

    def _plan_spec(self, decision: Decision, state: TickState, release: tuple[str, ...]) -> Plan:
        job, granted = self.job, False
        if job is None:
            job = self.job = self.backlog.grant()
            if job is None:
                raise RuntimeError("a speculative action was planned with no job and an empty backlog")
            self.obs.log_grant(",".join(job.ids))
            granted = True
        live = tuple([r.id for r in job.live_rows])  # a window's finished rows are not in this tick
        if not job.is_begun:  # slice 0 is a prefill: it never shares a fused forward
            kind, spans = slice0_spans(job, self.config.prefill_chunk_tokens, TickKind.SLICE0)
            return Plan(ActionKind.SPEC_ROUND, kind, state, live, job=job, release=release, spans=spans)
        if decision.block_size is not None:
            job.block_size = decision.block_size
        if decision.action is ActionKind.FUSED:
            rows = tuple(self.running[: self.config.max_batch_size])
            return Plan(ActionKind.FUSED, TickKind.FUSED, state, tuple(r.id for r in rows) + tuple(job.ids),
                        rows, job=job, release=release)
        kind = TickKind.GRANT if granted else TickKind.ROUND
        return Plan(ActionKind.SPEC_ROUND, kind, state, live, job=job, release=release)

    # -- the books ------------------------------------------------------------
    def commit(self, plan: Plan, outcome: Outcome, start_ms: float, end_ms: float) -> Committed:
        self._book_flags(plan)
        kind, ids = (TickKind.ERROR, outcome.touched) if outcome.error else (plan.kind, plan.request_ids)
        record = TickRecord(start_ms, end_ms, plan.action, kind, ids,
                            prefill_tokens(plan) if kind is TickKind.CHUNK or kind is TickKind.MIXED else ())
        if plan.job is not None:
            self._book_job(plan, outcome)
        self.policy.observe(plan, outcome, record, self)
        num_waiting = self._book_hol(plan, outcome, end_ms - start_ms)
        if plan.job is None and plan.kind in CLASSIC_PREFILLS:
            book_prefill(plan.rows, self.running, self.prefilling)
        elif plan.kind is TickKind.MIXED:
            book_prefill([s.request for s in plan.spans], self.running, self.prefilling)
        emissions = outcome.emissions
        if self._reaped:
            emissions, self._reaped = self._reaped + emissions, []
        events = self._events(emissions, end_ms)
        deltas = self._book_deltas(outcome, num_waiting)
        if self.policy.follows_upstream and plan.state.has_parked_prefill and plan.state.num_running:
            deltas = self._book_chunk_counts(plan, deltas)
        return Committed(record, events, deltas)

    def _events(self, emissions: list[Emission], end_ms: float) -> list[TokenEvent]:
        """The tick's token events, stamped with its end; finished requests are finalized first."""
        outcomes: dict[str, RequestOutcome] = {}
        for e in emissions:
            if e.finish_reason is not None and e.seq_id not in outcomes:
                outcomes[e.seq_id] = self._finalize(self.requests[e.seq_id])
        if len(emissions) > 1:
            emissions = merge_emissions(emissions)
        return [TokenEvent(e.seq_id, e.token_ids, end_ms, e.finish_reason, outcomes.get(e.seq_id))
                for e in emissions if e.token_ids or e.finish_reason is not None]

    def _book_deltas(self, outcome: Outcome, num_waiting: int) -> TickDeltas:
        """The speculative counters and the HOL waits the tick ended, into the books and its deltas."""
        if not (outcome.spec_rows or outcome.rounds or self._hol_samples):
            return NO_DELTAS  # a classic tick that ended no wait adds nothing
        obs = self.obs
        obs.rounds += outcome.rounds
        obs.drafted_tokens += outcome.drafted
        obs.accepted_tokens += outcome.accepted
        samples, self._hol_samples = self._hol_samples, []
        if samples:
            obs.add_hol_waits(samples)
        return TickDeltas(outcome.rounds, outcome.drafted, outcome.accepted, int(bool(outcome.spec_rows)),
                          tuple(samples), num_waiting)

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
        of a classic gap, not its end, so with decode rows waiting it keeps the flag."""
        action = plan.action
        flag = next_yield_flag(self.last_was_spec, action)
        is_prefill = action is ActionKind.PREFILL
        if is_prefill and self.config.is_chunked:
            is_spec_prefill = plan.kind in SPEC_PREFILLS and plan.job is not None
            if self.policy.follows_upstream:
                flag = flag or (is_spec_prefill and plan.kind is TickKind.CHUNK)
            else:
                flag = is_spec_prefill or (self.last_was_spec and plan.state.num_running > 0)
        self.last_was_spec = flag
        if action in SERVES_BATCH:
            self.last_was_prefill = False
        elif is_prefill and plan.spans:
            self.last_was_prefill = True

    def _book_job(self, plan: Plan, outcome: Outcome) -> None:
        """The served job leaves the slot when done, or parks when its grant expired (rotation)."""
        job = plan.job
        if job is None or job is not self.job:
            return
        if not job.live_rows:
            self.job = None
        elif (outcome.error is None and self.config.grant_rounds > 0 and len(self.backlog) > 0
              and not job.is_window and job.grant_slices >= self.config.grant_rounds):
            for request in job.rows:
                request.state = RequestState.PARKED
            self.backlog.park(job)
            self.obs.log_grant("park:" + ",".join(job.ids))
            self.job = None

    def _book_hol(self, plan: Plan, outcome: Outcome, wall: float) -> int:
        """HOL waits of this tick; returns how many classic rows waited on its speculative work."""
        if not outcome.spec_rows:  # a classic tick ends every wait; a park (bookkeeping: nobody served) none
            if plan.action is not ActionKind.IDLE and plan.kind is not TickKind.PARK and self._hol.has_waits:
                self._hol_samples += self._hol.end_queue_wait(len(self.queue))
                self._hol_samples += self._hol.end_batch_wait(len(self.running))
            return 0
        batch_served = plan.action is ActionKind.FUSED and outcome.error is None
        num_batch = 0 if batch_served else len(self.running)
        if num_batch and outcome.touched:  # a failed tick's rows (the batch's, if fused) did not wait
            touched = set(outcome.touched)
            num_batch = sum(r.id not in touched for r in self.running)
        num_waiting = len(self.queue) + num_batch
        self.obs.slices += 1
        self.obs.hol_waiters_max = max(self.obs.hol_waiters_max, num_waiting)
        jobs = self._jobs
        for seq_id in outcome.spec_rows:
            stats = jobs[seq_id].stats[seq_id]
            stats.slices += 1
            stats.wall_ms = max(stats.wall_ms, wall)
            stats.active_ms += wall
            stats.hol_waiters = max(stats.hol_waiters, num_waiting)
        self._hol.spec_tick(wall, batch_waits=not batch_served)
        if batch_served:
            self._hol_samples += self._hol.end_batch_wait(len(self.running))
        return num_waiting

    def _reap_cancelled(self) -> None:
        """Cancelled requests leave the queue, the batch and the backlog before the next action."""
        if not self._cancelled:
            return
        doomed = [r for r in self._cancelled.values()
                  if r.state in (RequestState.WAITING, RequestState.RUNNING, RequestState.PREFILLING)]
        if len(self.backlog):
            for job in self.backlog.drop_cancelled():
                self.obs.log_grant("drop:" + ",".join(job.ids))
                doomed += job.rows
        for request in doomed:
            if request.state is RequestState.WAITING:
                self.queue.remove(request)
                self._hol_samples += self._hol.leave_queue(request.id)
            elif request.state is RequestState.RUNNING:
                self.running.remove(request)
                self._hol_samples += self._hol.leave_batch()
            elif request.state is RequestState.PREFILLING:
                self.prefilling.remove(request)
            request.state = RequestState.FINISHED
            request.finish_reason = FinishReason.STOP
            self._reaped.append(Emission(request.id, (), FinishReason.STOP))

    def _finalize(self, request: Request) -> RequestOutcome:
        if request in self.running:  # a batch row that failed
            self.running.remove(request)
            self._hol_samples += self._hol.leave_batch()
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
