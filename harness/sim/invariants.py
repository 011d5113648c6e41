"""Scheduler invariants checked after every tick (state machine and `coopsched simulate`).

`Checked` drives one Scheduler tick by tick (`Engine.step`: schedule -> run -> commit) over a
`FaultyBackend` around a MockBackend in virtual time, and raises
`InvariantError` naming the tick and the rule as soon as one breaks: KV slots add up
and are held exactly by admitted requests, every live request is in exactly one
place, one action (and at most one speculative job) per tick, strict alternation in
slice mode, streamed tokens equal committed ones with one finish event each, finished
outputs and finish reasons equal the reference oracle's (mocks.oracle), errors only
where a fault hit. Chunked and batched prefill: a tick prefills within its budget and
row cap, a round never drafts a row whose prompt is not all in, and with chunking a
classic gap holds at most one prefill tick (and, in slice and fused mode, one
speculative round or chunk).
"""

from __future__ import annotations

from collections import Counter

from coopsched.core import ActionKind, FinishReason, Request, RequestState, Scheduler, TickKind
from coopsched.core.scheduler import WAITER_CANCELLED
from coopsched.engine import Engine
from mocks import oracle

ADMITTED = (RequestState.RUNNING, RequestState.PREFILLING, RequestState.SPECULATIVE, RequestState.PARKED)
ALLOWED_CALLS = {  # model calls each action may make (burst and slice 0 run inside Prefill)
    ActionKind.IDLE: set(),
    ActionKind.DECODE: {"decode"},
    ActionKind.PREFILL: {"prefill", "draft", "verify"},
    ActionKind.SPEC_ROUND: {"prefill", "draft", "verify"},
    ActionKind.FUSED: {"prefill", "draft", "fused", "decode"},
    ActionKind.MIXED: {"decode", "prefill"},
}


class InvariantError(AssertionError):
    pass


def _rules(request: Request) -> str:
    """The request's own ending rules, for a failure message."""
    sampling, rules = request.sampling, []
    if sampling.min_tokens:
        rules.append(f"min_tokens={sampling.min_tokens}")
    if sampling.ignore_eos:
        rules.append("ignore_eos")
    if request.stop:
        rules.append(f"stop={list(request.stop)}")
    return f" [{', '.join(rules)}]" if rules else ""


class Checked:
    """One scheduler, ticked and checked. `faulty` wraps `mock`; the scheduler runs on `faulty`."""

    def __init__(self, scheduler: Scheduler, faulty, mock, clock) -> None:
        self.scheduler, self.faulty, self.mock, self.clock = scheduler, faulty, mock, clock
        self.engine = Engine(scheduler, faulty, clock)
        self.submitted: dict[str, Request] = {}
        self.streamed: dict[str, list[int]] = {}
        self.finished: dict[str, FinishReason] = {}
        self.doomed: set[str] = set()      # rows a raising fault hit: they must end in ERROR
        self.num_ticks = 0
        self.actions: Counter = Counter()
        self.kinds: Counter = Counter()    # tick kinds (chunk ticks, batched prefills)
        self._gap_prefills = 0             # chunking: prefill ticks since the decode rows were served
        self._gap_spec = 0                 # ... and speculative ticks
        self._decodes_beside_chunk = 0     # upstream's rule: decode ticks a chunked prompt yielded in a row
        self.kv_full_ticks = 0
        self._last_action: ActionKind | None = None
        self._in_tick = False
        self.broken = False
        self.cancelled_at: dict[str, int] = {}  # the last tick that may still emit tokens for it
        self._num_fired = 0

    # -- driving --------------------------------------------------------------
    def submit(self, request: Request) -> None:
        request.arrival_ms = self.clock.now()
        self.scheduler.submit(request)
        self.submitted[request.id] = request
        self.streamed[request.id] = []

    def cancel(self, seq_id: str) -> bool:
        """Cancel between ticks, or from inside a model call (a disconnect mid-tick)."""
        is_live = self.scheduler.cancel(seq_id)
        if is_live:
            self.cancelled_at.setdefault(seq_id, self.num_ticks + (1 if self._in_tick else 0))
        return is_live

    @property
    def live_ids(self) -> list[str]:
        return [i for i in self.submitted if i not in self.finished]

    def step(self) -> None:
        """One tick, exactly as Engine.step, then every invariant."""
        try:
            self._step()
        except BaseException:
            self.broken = True  # the state is no longer meaningful: report this, not later fallout
            raise

    def _step(self) -> None:
        self.faulty.take_calls()  # calls outside a tick (none expected) are not this tick's
        self._in_tick = True
        try:
            committed = self.engine.step()
        finally:
            self._in_tick = False
        plan, record, events = committed.plan, committed.record, committed.events
        state = plan.state
        classic_pending = state.num_running > 0 or state.num_admissible > 0 or state.has_chunked_prefill
        if state.num_queued > 0 and state.num_free_slots == 0:
            self.kv_full_ticks += 1
        self.num_ticks += 1
        self.actions[record.action.value] += 1
        self.kinds[record.kind.value] += 1
        if record.kind is TickKind.ADMIT and len(record.request_ids) > 1:
            self.kinds["admit-batch"] += 1
        where = f"tick {self.num_ticks} ({record.action.value} {record.kind.value} {','.join(record.request_ids)})"
        calls = self.faulty.take_calls()
        self._check_action(plan, calls, classic_pending, where)
        self._check_prefill(plan, calls, where)
        self._collect_faults()
        self._check_events(events, where)
        self._check_doomed(where)
        self.check_state(where)

    def drain(self, max_ticks: int) -> None:
        """Tick until every submitted request has finished (liveness)."""
        for _ in range(max_ticks):
            if not self.live_ids and not self.scheduler.has_work:
                return
            self.step()
        raise InvariantError(f"no progress: {self.live_ids} still live after {max_ticks} more ticks")

    # -- the rules ------------------------------------------------------------
    def _fail(self, where: str, message: str) -> None:
        raise InvariantError(f"{where}: {message}")

    def _check_action(self, plan, calls, classic_pending, where) -> None:
        action = plan.action
        kinds = Counter(kind for kind, _ in calls)
        if not set(kinds) <= ALLOWED_CALLS.get(action, set()):
            self._fail(where, f"{action.value} tick made model calls {dict(kinds)}")
        job_ids = set(plan.job_ids)
        drafted = {i for kind, ids in calls if kind in ("draft", "verify") for i in ids}
        if not drafted <= job_ids:
            self._fail(where, f"rows {sorted(drafted - job_ids)} drafted outside the tick's job {sorted(job_ids)}")
        sliced = self.scheduler.config.is_sliced
        if sliced and (kinds["draft"] > 1 or kinds["verify"] + kinds["fused"] > 1):
            self._fail(where, f"more than one speculative round in a sliced tick: {dict(kinds)}")
        if (sliced and self.scheduler.config.mode == "slice" and classic_pending
                and action is ActionKind.SPEC_ROUND and self._last_action is ActionKind.SPEC_ROUND):
            self._fail(where, "a classic row with pending work waited two speculative rounds in a row")
        if action is not ActionKind.IDLE:
            self._last_action = action

    def _check_prefill(self, plan, calls, where) -> None:
        config = self.scheduler.config
        spans = () if plan.kind is TickKind.BURST else plan.prefills  # a burst runs its request whole
        if not plan.job_ids and spans and len(spans) > config.max_batch_prefill:
            self._fail(where, f"{len(spans)} rows prefilled together > max_batch_prefill")
        if not config.is_chunked:
            return
        if self.scheduler.policy.follows_upstream:
            self._check_grant(plan, where)
        drafted = {i for kind, ids in calls if kind in ("draft", "verify") for i in ids}
        for request in (self.submitted[i] for i in plan.job_ids):
            if request.id in drafted and request.num_prefilled != len(request.prompt_token_ids):
                self._fail(where, f"{request.id} drafted with {request.num_prefilled} of its "
                                  f"{len(request.prompt_token_ids)} prompt tokens prefilled")
        tokens = sum(s.stop - s.start for s in spans)
        if tokens > config.prefill_chunk_tokens:
            self._fail(where, f"{tokens} prompt tokens prefilled in one tick > the chunk budget")
        if self.scheduler.policy.follows_upstream:
            return  # upstream's rule admits before decoding and lets a Prefill re-arm the round: no per-gap cap
        if plan.state.num_running == 0 or plan.action in (ActionKind.DECODE, ActionKind.FUSED):
            self._gap_prefills = self._gap_spec = 0  # the decode rows were served (or none waited)
            return
        self._gap_prefills += plan.action is ActionKind.PREFILL and bool(spans)
        self._gap_spec += plan.action is ActionKind.SPEC_ROUND
        if self._gap_prefills > 1:
            self._fail(where, "a decode row waited two prefill ticks in a row (chunking)")
        if self._gap_spec > 1 and config.mode in ("slice", "fused") and config.is_sliced:
            self._fail(where, "a decode row waited two speculative ticks in one gap (chunking)")

    def _check_grant(self, plan, where) -> None:
        """Beside decode rows a chunked prompt yields exactly `prefill_grant_interval` decode ticks per
        chunk (rounds move nothing; the mixed step runs a chunk every tick; 0 never grants)."""
        state, action = plan.state, plan.action
        interval = self.scheduler.config.prefill_grant_interval
        if not (state.has_chunked_prefill and state.num_running):
            self._decodes_beside_chunk = 0
            return
        if action is ActionKind.DECODE:
            self._decodes_beside_chunk += 1
            if interval and self._decodes_beside_chunk > interval:
                self._fail(where, f"{self._decodes_beside_chunk} decode ticks in a row beside a chunked prompt "
                                  f"> the grant interval {interval}")
        elif action is ActionKind.PREFILL:
            if self._decodes_beside_chunk != interval or not interval:
                self._fail(where, f"a chunk granted after {self._decodes_beside_chunk} decode ticks, not the "
                                  f"interval {interval}")
            self._decodes_beside_chunk = 0
        elif action is ActionKind.MIXED:
            self._decodes_beside_chunk = 0

    def _check_events(self, events, where) -> None:
        for event in events:
            seq_id = event.seq_id
            if seq_id not in self.submitted:
                self._fail(where, f"event for unknown request {seq_id!r}")
            if seq_id in self.finished:
                self._fail(where, f"event for {seq_id!r} after its finish ({self.finished[seq_id].value})")
            if event.token_ids and self.num_ticks > self.cancelled_at.get(seq_id, self.num_ticks):
                self._fail(where, f"{seq_id} emitted {len(event.token_ids)} token(s) after its cancel "
                                  f"took effect (cancelled by tick {self.cancelled_at[seq_id]})")
            self.streamed[seq_id].extend(event.token_ids)
            if event.finish_reason is not None:
                self.finished[seq_id] = event.finish_reason
        for seq_id in {e.seq_id for e in events}:
            request = self.submitted[seq_id]
            if self.streamed[seq_id] != request.output_token_ids:
                self._fail(where, f"{seq_id}: streamed {self.streamed[seq_id]} != committed "
                                  f"{request.output_token_ids}")
            if seq_id in self.finished:
                self._check_finished(request, where)

    def _check_finished(self, request: Request, where: str) -> None:
        reason = self.finished[request.id]
        if request.finish_reason is not reason or not request.is_finished:
            self._fail(where, f"{request.id}: finish event {reason.value} but request is "
                              f"{request.state.value}/{request.finish_reason}")
        # upstream's rule: a waiter cancelled in the backlog is aborted with an error at its grant
        aborted = request.is_cancelled and request.error == WAITER_CANCELLED
        if reason is FinishReason.ERROR and request.id not in self.doomed and not aborted:
            self._fail(where, f"{request.id} ended in error but no fault hit it: {request.error}")
        expected = oracle.expected(self.mock.target, request, self.mock.detokenize)
        out = request.output_token_ids
        if request.is_cancelled or reason is FinishReason.ERROR:
            if out != expected.token_ids[: len(out)]:
                self._fail(where, f"{request.id}: output {out} is not a prefix of the reference "
                                  f"{expected.token_ids}")
        elif (out, reason) != expected:
            self._fail(where, f"{request.id}: output {out} ({reason.value}) != reference {expected.token_ids} "
                              f"({expected.finish_reason.value}){_rules(request)}")

    def _collect_faults(self) -> None:
        for fault, rows in self.faulty.fired[self._num_fired:]:
            if fault.kind == "raise":
                self.doomed.add(rows[0] if fault.seq_id == "*" else fault.seq_id)
            elif fault.kind == "generic":
                self.doomed.update(rows)
        self._num_fired = len(self.faulty.fired)

    def _check_doomed(self, where) -> None:
        for seq_id in self.doomed:
            if self.finished.get(seq_id) is not FinishReason.ERROR:
                self._fail(where, f"{seq_id}: a model call failed for it but it is "
                                  f"{self.finished.get(seq_id, 'still live')}, not finished with an error")

    def check_state(self, where: str = "state") -> None:
        sched = self.scheduler
        kv = sched.kv
        if kv.num_in_use + kv.num_free != kv.num_slots:
            self._fail(where, f"KV slots: {kv.num_in_use} in use + {kv.num_free} free != {kv.num_slots}")
        places: Counter = Counter()
        states = {}
        for request in sched.queue:
            places[request.id] += 1
            states[request.id] = RequestState.WAITING
        for request in sched.running:
            places[request.id] += 1
            states[request.id] = RequestState.RUNNING
        for request in sched.prefilling:
            places[request.id] += 1
            states[request.id] = RequestState.PREFILLING
        jobs = [sched.job] if sched.job is not None else []
        for job in [*jobs, *sched.backlog]:
            for request in job.live_rows:
                places[request.id] += 1
                states[request.id] = RequestState.SPECULATIVE if job is sched.job else RequestState.PARKED
        if sched.job is not None and any(sched.job is j for j in sched.backlog):
            self._fail(where, "the active speculative job is also parked in the backlog")
        if sched.job is not None and not sched.job.live_rows:
            self._fail(where, "an active speculative job with no live rows")
        for seq_id, request in sched.requests.items():
            if request.is_finished:
                self._fail(where, f"{seq_id} finished but still live in the scheduler")
            if places[seq_id] != 1:
                self._fail(where, f"{seq_id} ({request.state.value}) is in {places[seq_id]} places")
            if request.state is not states[seq_id]:
                self._fail(where, f"{seq_id} is {request.state.value} but sits where "
                                  f"{states[seq_id].value} requests sit")
            if kv.holds(seq_id) != (request.state in ADMITTED):
                self._fail(where, f"{seq_id} ({request.state.value}) holds_slot={kv.holds(seq_id)}")
        if set(places) != set(sched.requests):
            self._fail(where, f"requests placed but not live: {sorted(set(places) - set(sched.requests))}")
        if len(sched.running) + len(sched.prefilling) > sched.config.max_batch_size:
            self._fail(where, f"{len(sched.running)} classic rows + {len(sched.prefilling)} prefilling "
                              "> max_batch_size")
        live_caches = set(getattr(self.mock, "_seqs", {}))
        if not live_caches <= set(sched.requests):
            self._fail(where, f"backend caches leaked for {sorted(live_caches - set(sched.requests))}")
        for seq_id in self.finished:
            if seq_id in sched.requests or kv.holds(seq_id):
                self._fail(where, f"{seq_id} finished but still holds a slot or a place")

    def summary(self) -> dict:
        reasons = Counter(r.value for r in self.finished.values())
        return {"ticks": self.num_ticks, "requests": len(self.submitted), "finished": dict(reasons),
                "actions": dict(self.actions), "kinds": dict(self.kinds), "kv_full_ticks": self.kv_full_ticks,
                "faults": Counter(f"{f.kind}:{f.call}" for f, _ in self.faulty.fired)}
