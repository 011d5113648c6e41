"""The scheduler: state, one action per tick, and the commit of its results.

Two calls and a loop: `schedule()` reaps cancels and decides; `execute()` runs
the action through the backend; `commit(executed, start_ms, end_ms)` stamps
tokens with the tick's end (when they become visible) and keeps the books.
The engine owns the clock and passes the times in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .arbiter import Arbiter
from .backend import ModelBackend
from .commit import commit_tokens
from .config import SchedulerConfig
from .dispatch import Route, dispatch, same_shape
from .failures import BackendError, GuardedBackend, fail_tick
from .fused import decide_fused, run_fused
from .kv import KVSlotPool
from .observability import BatchObservability, BurstFinalized, TickRecord
from .policy import ActionKind, TickState, decide_action, next_yield_flag
from .queue import PrefillQueue
from .request import FinishReason, Request, RequestError, RequestState
from .rotation import Backlog
from .spec import Emission, SpecJob


@dataclass(frozen=True, slots=True)
class TokenEvent:
    seq_id: str
    token_ids: tuple[int, ...]
    time_ms: float
    finish_reason: FinishReason | None = None


@dataclass(slots=True)
class Executed:
    action: ActionKind
    request_ids: tuple[str, ...] = ()
    detail: str = ""
    emissions: list[Emission] = field(default_factory=list)
    spec_worked: list[str] = field(default_factory=list)  # rows that did speculative model work
    waiting: list[str] = field(default_factory=list)      # classic rows with pending work


class Scheduler:
    def __init__(self, config: SchedulerConfig, backend: ModelBackend) -> None:
        self.config = config
        self.backend = GuardedBackend(backend)  # a failed model call fails only its rows (failures.py)
        self.queue = PrefillQueue()
        self.running: list[Request] = []
        self.job: SpecJob | None = None
        self.backlog = Backlog(config.backlog_cap, config.skip_cap)
        self.kv = KVSlotPool(config.num_kv_slots, config.slot_tokens)
        self.obs = BatchObservability()
        self.last_was_spec = False
        self.requests: dict[str, Request] = {}   # every live request, by id
        self._jobs: dict[str, SpecJob] = {}      # speculative request id -> its job
        self._reaped: list[Emission] = []
        self._hol_accum: dict[str, float] = {}
        self._partial: list[Emission] = []  # what this tick's slices emitted, should a later one fail
        self.arbiter = Arbiter(config.hol_budget_ms, config.block_size) if config.mode == "cost" else None

    # -- intake ---------------------------------------------------------------
    def submit(self, request: Request) -> None:
        if not request.prompt_token_ids:
            raise RequestError(f"request {request.id!r}: the prompt is empty; send at least one token")
        if request.id in self.requests:
            raise RequestError(f"request id {request.id!r} is already live")
        self.kv.check_fits(request)
        request.state = RequestState.WAITING
        self.requests[request.id] = request
        self.queue.push(request)

    def cancel(self, seq_id: str) -> bool:
        """Flag a live request; it stops at its next round or decode step."""
        request = self.requests.get(seq_id)
        if request is None or request.is_finished:
            return False
        request.is_cancelled = True
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.requests) or bool(self._reaped)

    @property
    def is_idle(self) -> bool:
        """Nothing to do until something arrives (cancelled requests still to reap are work)."""
        return not self._reaped and not any(r.is_cancelled for r in self.requests.values()) \
            and decide_action(self.tick_state()) is ActionKind.IDLE

    @property
    def has_spec_work(self) -> bool:
        return self.job is not None or len(self.backlog) > 0

    def tick_state(self) -> TickState:
        return TickState(has_spec_work=self.has_spec_work, num_running=len(self.running),
                         max_batch_size=self.config.max_batch_size,
                         num_admissible=len(self.queue) if self.kv.num_free else 0,
                         last_was_spec=self.last_was_spec)

    # -- one tick -------------------------------------------------------------
    def schedule(self) -> ActionKind:
        self._reap_cancelled()
        state = self.tick_state()
        if self.arbiter is not None:
            return self.arbiter.decide(state, self)
        return decide_fused(state) if self.config.mode == "fused" else decide_action(state)

    def execute(self, action: ActionKind) -> Executed:
        waiting = [r.id for r in self.running] + [r.id for r in self.queue]
        try:
            if action is ActionKind.PREFILL:
                done = self._prefill()
            elif action is ActionKind.DECODE:
                done = self._decode()
            elif action is ActionKind.SPEC_ROUND:
                done = self._spec_round()
            elif action is ActionKind.FUSED:
                done = run_fused(self)
            else:
                done = Executed(action)
        except BackendError as exc:
            done = fail_tick(self, action, exc)
        if done.spec_worked:
            done.waiting = [i for i in waiting if i not in done.spec_worked and i not in done.request_ids]
        return done

    def commit(self, done: Executed, start_ms: float, end_ms: float) -> tuple[TickRecord, list[TokenEvent]]:
        self.last_was_spec = next_yield_flag(self.last_was_spec, done.action)
        wall = end_ms - start_ms
        if self.arbiter is not None:
            self.arbiter.observe(done, start_ms, end_ms, self)
        if done.spec_worked:
            self._account_spec_tick(done, wall)
            if done.action is ActionKind.FUSED:  # its classic rows advanced: their waits end
                self._flush_hol_waits(done.request_ids)
        elif done.action is not ActionKind.IDLE:
            self._flush_hol_waits()
        emissions, self._reaped, self._partial = self._reaped + done.emissions, [], []
        events = [TokenEvent(e.seq_id, e.token_ids, end_ms, e.finish_reason) for e in _merge(emissions)
                  if e.token_ids or e.finish_reason is not None]
        for emission in emissions:
            if emission.finish_reason is not None:
                self._finalize(self.requests[emission.seq_id])
        return TickRecord(start_ms, end_ms, done.action.value, done.request_ids, done.detail), events

    # -- actions --------------------------------------------------------------
    def _prefill(self) -> Executed:
        head = self.queue.pop()
        siblings = [r for r in self.queue if r.speculative and same_shape(head, r, self.config.enable_ragged)]
        route = dispatch(head, self.config, slot_busy=self.has_spec_work,
                         backlog_has_room=self.backlog.has_room, num_siblings=len(siblings))
        if route is Route.WAITER:
            self.kv.acquire(head.id)
            head.state = RequestState.PARKED
            self._jobs[head.id] = job = SpecJob([head], self.config.block_size)
            self.backlog.park(job)
            self.obs.waiter_parks += 1
            return Executed(ActionKind.PREFILL, (head.id,), "park")
        if route is Route.CLASSIC:
            self.kv.acquire(head.id)
            first = self.backend.prefill(head.id, head.prompt_token_ids, head.sampling, False)
            emission = self._commit_classic(head, first)
            if emission.finish_reason is None:
                head.state = RequestState.RUNNING
                self.running.append(head)
            return Executed(ActionKind.PREFILL, (head.id,), "admit", [emission])
        rows = [head]
        if route is Route.WINDOW:
            limit = min(self.config.max_window - 1, self.kv.num_free - 1)
            rows += self.queue.take_where(lambda r: r in siblings, limit)
        for request in rows:
            self.kv.acquire(request.id)
        job = SpecJob(rows, self.config.block_size)
        for request in rows:
            self._jobs[request.id] = job
        self.job = job
        self.obs.grant_log.append(",".join(job.ids))
        emissions = self._run_slice(job, job.begin)
        if not self.config.is_sliced:
            while self.job is not None:
                emissions += self._run_slice(job, job.step)
            detail = "burst"
        else:
            detail = "window" if job.is_window else "slice0"
        return Executed(ActionKind.PREFILL, tuple(job.ids), detail, emissions, spec_worked=job.ids)

    def _decode(self) -> Executed:
        rows = self.running[: self.config.max_batch_size]
        tokens = self.backend.decode([(r.id, r.last_token) for r in rows])
        emissions = [self._commit_classic(r, t) for r, t in zip(rows, tokens)]
        return Executed(ActionKind.DECODE, tuple(r.id for r in rows), "", emissions)

    def _spec_round(self) -> Executed:
        detail = "round"
        if self.job is None:
            self.job = self.backlog.grant()
            self.obs.grant_log.append(",".join(self.job.ids))
            detail = "grant" if self.job.is_begun else "slice0"  # a waiter's slice 0 is its admission
        job = self.job
        if self.arbiter is not None:
            detail = self.arbiter.start_round(job, detail)
        live = tuple(r.id for r in job.live_rows)  # a window's finished rows are not in this tick
        emissions = self._run_slice(job, job.step if job.is_begun else job.begin)
        return Executed(ActionKind.SPEC_ROUND, live, detail, emissions,
                        spec_worked=list(job.last_worked))

    def _run_slice(self, job: SpecJob, slice_fn) -> list[Emission]:
        """One slice of the active job, its counters, then finish or rotation expiry."""
        before = _totals(job)
        emissions = slice_fn(self.backend, self.backend.detokenize)
        self._partial += emissions
        after = _totals(job)
        self.obs.rounds += after[0] - before[0]
        self.obs.drafted_tokens += after[1] - before[1]
        self.obs.accepted_tokens += after[2] - before[2]
        if job.is_done:
            self.job = None
        elif (self.config.grant_rounds > 0 and len(self.backlog) > 0 and not job.is_window
              and job.grant_slices >= self.config.grant_rounds):
            for request in job.rows:
                request.state = RequestState.PARKED
            self.backlog.park(job)
            self.obs.grant_log.append("park:" + ",".join(job.ids))
            self.job = None
        return emissions

    def _commit_classic(self, request: Request, token: int) -> Emission:
        committed, reason = commit_tokens(request, [token], self.backend.eos_token_id,
                                          self.backend.detokenize)
        if reason is not None:
            request.state = RequestState.FINISHED
            request.finish_reason = reason
        return Emission(request.id, tuple(committed), reason)

    # -- books ----------------------------------------------------------------
    def _account_spec_tick(self, done: Executed, wall: float) -> None:
        num_waiting = len(done.waiting)
        self.obs.slices += 1
        self.obs.hol_waiters_max = max(self.obs.hol_waiters_max, num_waiting)
        for seq_id in done.spec_worked:
            stats = self._jobs[seq_id].stats[seq_id]
            stats.slices += 1
            stats.wall_ms = max(stats.wall_ms, wall)
            stats.active_ms += wall
            stats.hol_waiters = max(stats.hol_waiters, num_waiting)
        for seq_id in done.waiting:
            self._hol_accum[seq_id] = self._hol_accum.get(seq_id, 0.0) + wall

    def _flush_hol_waits(self, only: tuple[str, ...] | None = None) -> None:
        for seq_id in list(self._hol_accum) if only is None else [i for i in only if i in self._hol_accum]:
            wait = self._hol_accum.pop(seq_id)
            if wait > 0:
                self.obs.hol_wait_ms.append(wait)

    def _reap_cancelled(self) -> None:
        """Cancelled requests leave the queue, the batch and the backlog before the next action."""
        doomed = [r for r in list(self.queue) + self.running if r.is_cancelled]
        for job in self.backlog.drop_cancelled():
            self.obs.grant_log.append("drop:" + ",".join(job.ids))
            doomed += job.rows
        for request in doomed:
            if request.state is RequestState.WAITING:
                self.queue.remove(request)
            request.state = RequestState.FINISHED
            request.finish_reason = FinishReason.STOP
            self._reaped.append(Emission(request.id, (), FinishReason.STOP))
        self.running = [r for r in self.running if not r.is_finished]  # or this tick decodes them

    def _finalize(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        hol = self._hol_accum.pop(request.id, 0.0)
        if hol > 0:
            self.obs.hol_wait_ms.append(hol)
        self.kv.release(request.id)
        self.backend.release(request.id)
        self.requests.pop(request.id, None)
        job = self._jobs.pop(request.id, None)
        if job is not None and job.is_begun:
            record = BurstFinalized.of(request.id, job.stats[request.id], len(request.output_token_ids))
            self.obs.bursts.append(record)


def _merge(emissions: list[Emission]) -> list[Emission]:
    """One emission per request per tick: a legacy burst streams as one lump."""
    merged: dict[str, Emission] = {}
    for e in emissions:
        prev = merged.get(e.seq_id)
        merged[e.seq_id] = e if prev is None else Emission(e.seq_id, prev.token_ids + e.token_ids,
                                                             e.finish_reason or prev.finish_reason)
    return list(merged.values())


def _totals(job: SpecJob) -> tuple[int, int, int]:
    return (sum(s.rounds for s in job.stats.values()), sum(s.drafted for s in job.stats.values()),
            sum(s.accepted for s in job.stats.values()))
