"""The scheduler: state, intake, a plan per tick, and commit's top level.

`schedule()` asks the mode's policy for one action and plans it as a message; the executor
runs it; `commit(plan, result, start_ms, end_ms, arrivals)` appends what the model produced,
has its `Books` keep the books and says what the executor must rewind and release. No model, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial

from .admission import Admission
from .append import Vocab
from .books import NO_DELTAS, Books
from .config import SchedulerConfig
from .dispatch import shape_key
from .hol import HolBook
from .kv import KVSlotPool, check_queueable
from .modes import make_policy
from .observability import BatchObservability
from .outputs import append_prefills, append_result, fail_rows
from .plan import Committed, Decode, Plan, Result, Verify
from .policy import Decision
from .prefill import Budget, planned_tokens, slice0_spans, spans_for
from .queue import PrefillQueue
from .request import Request, RequestState
from .rotation import Backlog
from .spec import SpecJob
from .types import ActionKind, FinishReason, SpecStats, TickKind, TickRecord, TickState, TokenEvent

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
        self.decode_ticks = 0                    # the grant counter (upstream's rule), set where it is decided
        self.requests: dict[str, Request] = {}   # every live request, by id
        self._jobs: dict[str, SpecJob] = {}      # speculative request id -> its job
        self._cancelled: dict[str, Request] = {}  # live and flagged, in the order flagged
        self._hol = HolBook()
        self.admission = Admission(config, self.queue, self.kv, self.backlog, self._hol, self.obs, self._jobs,
                                   self.running, self.prefilling, self.policy.keeps_slot,
                                   self.policy.follows_upstream)
        self.books = Books(config, self.policy, self.requests, self.queue, self.kv, self.backlog, self._hol,
                           self.obs, self._jobs, self.running, self.prefilling, self._cancelled)

    # -- intake ---------------------------------------------------------------
    def validate(self, request: Request) -> None:
        """Raise RequestError if the request can never be queued now."""
        check_queueable(request, self.requests, self.kv)

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
        return bool(self.requests) or bool(self.books.events)

    @property
    def has_spec_work(self) -> bool:
        return self.job is not None or len(self.backlog) > 0

    @property
    def is_idle(self) -> bool:
        """Nothing to do until something arrives (cancelled requests still to reap are work)."""
        # decide_action's Idle: no speculative work, no batch, nothing admissible
        return not (self.books.events or self._cancelled or self.running or self.prefilling or self.has_spec_work
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
                         self.books.last_was_spec, num_queued, num_free_slots, chunked and self.books.last_was_prefill,
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
                    self.books.add_early(TokenEvent(request.id, (), 0.0, FinishReason.ERROR))
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
            self.books.add_early(TokenEvent(seq_id, (), 0.0, self.requests[seq_id].finish_reason))

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
                append_prefills(plan, result, self.requests, self.vocab, end_ms, self.books.events, result.failed)
            touched = self._fail(plan, result, releases)
        committed, self.job = self.books.book(plan, result, start_ms, end_ms, touched, rewinds, releases, self.job,
                                              bool(plan.job_ids) and self._keeps_slot(plan), self)
        return committed

    def _keeps_slot(self, plan: Plan) -> bool:
        """A burst keeps the slot: its next round runs inside this tick (the policy chose BURST)."""
        return plan.kind is TickKind.BURST

    def _append(self, plan: Plan, result: Result, end_ms: float, rewinds: list[tuple[str, int]]) -> None:
        assert self.vocab is not None, "the scheduler needs the model's vocab to commit (Engine gives it)"
        rows, drafted, accepted = append_result(plan, result, self.requests, self.job if plan.job_ids else None,
                                                self.vocab, end_ms, self.books.events, rewinds)
        if rows:
            self.books.count_rounds(rows, drafted, accepted)

    def _fail(self, plan: Plan, result: Result, releases: list[str]) -> tuple[str, ...]:
        events = self.books.events
        num_events = len(events)
        touched = fail_rows(plan, result, self.requests, self.job if plan.job_ids else None, events, releases)
        self.books.num_early += len(events) - num_events  # finish events, stamped with the tick's end
        return touched

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
