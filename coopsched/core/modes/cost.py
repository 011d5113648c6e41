"""Cost mode: a cost-aware arbiter that bounds the HOL stall in milliseconds, not ticks.

It learns action costs from the tick walls commit passes it (never a clock) and picks rounds
and their width K so every running classic row gets its next token within `hol_budget_ms`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..plan import Plan
from ..policy import Decision, SchedulerView, decide_action, wants_prefill
from ..request import Request
from ..spec import SpecJob
from ..types import ActionKind, TickKind, TickRecord, TickState

MIN_BLOCK_SIZE = 2
EPS_MS = 1e-9


class CostEstimator:
    """Upper bounds on an action's cost from measured ones, keyed by its sizes.

    Assumes cost is non-decreasing in every size and grows at most proportionally
    (affine with a non-negative intercept, as a forward's cost is): a measured point
    bounds every smaller size, and bounds a larger one once scaled by the ratio.
    """

    def __init__(self) -> None:
        self._points: dict[tuple[int, ...], float] = {}

    def __contains__(self, size: tuple[int, ...]) -> bool:
        return size in self._points

    def observe(self, size: tuple[int, ...], ms: float) -> None:
        self._points[size] = max(self._points.get(size, 0.0), ms)

    def estimate(self, size: tuple[int, ...]) -> float | None:
        best = None
        for point, ms in self._points.items():
            scale = 1.0
            for want, have in zip(size, point):
                scale *= max(1.0, want / max(have, 1))
            best = ms * scale if best is None else min(best, ms * scale)
        return best


class CostPolicy:
    """Learns what actions cost from the committed ticks' walls and the acceptance rate from the
    rounds' counters. Before each tick, while classic rows run, it runs another speculative round
    only if it still lets every running classic row get its next token within `hol_budget_ms` of
    its last one, so several rounds may run between two decode steps; among the widths K in
    [2, block_size] that fit it takes the one with the most expected tokens per ms (an unmeasured
    width that fits is tried first: its bound is safe). With no classic work, speculation runs
    back to back, no budget.

    Unmeasured costs: at most one speculative action per classic gap (a probe, at the smallest K,
    right after a classic service), so the arbiter is never worse than strict alternation. A
    budget below the floor (one decode + the smallest round) cannot be met: the arbiter then
    alternates at the smallest K rather than starve. A chunked slice 0 is budgeted like a round:
    its next chunk's cost is learnt from the chunks and slice 0s measured (by tokens)."""

    follows_upstream = False  # its own rule: rounds budgeted in ms

    def __init__(self, config: Any) -> None:
        self.keeps_slot = config.draft_kind == "dflash"
        self.budget_ms = config.hol_budget_ms
        self.max_k = config.block_size
        self.chunk_tokens = config.prefill_chunk_tokens  # 0: a slice 0 prefills its whole prompt
        self.k = config.block_size              # K of the next round
        self.decode = CostEstimator()           # (batch size,)
        self.round = CostEstimator()            # (K, rows)
        self.slice0 = CostEstimator()           # (prompt tokens a slice 0 or one chunk of it prefills,)
        self.now_ms = 0.0                       # end of the last committed tick
        self.num_accepted = 0                   # drafts accepted, and rounds that hit a miss:
        self.num_missed = 0                     # per-draft acceptance ~ accepted / (accepted + missed)
        self.k_log: list[int] = []              # K of every round run (reports, tests)
        self._tick = 0
        self._served: dict[str, tuple[int, float]] = {}  # classic row -> (tick, time) of its last token
        self._last_spec_tick = -1
        self._seen_accepted: dict[str, int] = {}

    # -- deciding -------------------------------------------------------------
    def decide(self, state: TickState, sched: SchedulerView) -> Decision:
        action = self._decide(state, sched)
        return Decision(action, self.k if action is ActionKind.SPEC_ROUND else None)

    def _decide(self, state: TickState, sched: SchedulerView) -> ActionKind:
        running = sched.running[: state.max_batch_size]
        oldest = min((self._served[r.id][0] for r in running if r.id in self._served), default=self._tick)
        spec_in_gap = bool(running) and self._last_spec_tick > oldest
        if not state.has_spec_work and not spec_in_gap:
            return decide_action(state)
        if not running:
            if wants_prefill(state):
                return ActionKind.PREFILL
            if not state.has_spec_work:
                return ActionKind.IDLE
            self.k = self._choose_k(_num_rows(sched), float("inf")) or MIN_BLOCK_SIZE  # no one waits
            return ActionKind.SPEC_ROUND
        if wants_prefill(state) and not spec_in_gap:
            return ActionKind.PREFILL  # admissions (and chunks) go right after a classic service
        if state.has_spec_work and self._fit(sched, running, is_fresh=oldest == self._tick):
            return ActionKind.SPEC_ROUND
        return ActionKind.DECODE

    def _fit(self, sched: SchedulerView, running: Sequence[Request], is_fresh: bool) -> bool:
        """Whether a speculative action fits before the next decode; sets `self.k`.

        `is_fresh`: every running row got a token in the last tick (nothing else is in this gap).
        """
        decode = self.decode.estimate((len(running),))
        if decode is None:
            return False  # serve (and so measure) the classic rows first
        waited = self.now_ms - min(self._served.get(r.id, (0, self.now_ms))[1] for r in running)
        spare = self.budget_ms - waited - decode
        jobs = _next_jobs(sched)
        if all(j.is_begun for j in jobs):
            num_rows = _num_rows(sched)
            k = self._choose_k(num_rows, spare)
            if k is not None:
                self.k = k
                return True
            smallest = self.round.estimate((MIN_BLOCK_SIZE, num_rows))
        else:  # a granted waiter's slice 0 (a prefill of its prompt), or a begun job at full K
            costs = [self.slice0.estimate((_slice0_tokens(j, self.chunk_tokens),)) if not j.is_begun
                     else self.round.estimate((self.max_k, len(j.live_rows))) for j in jobs]
            known = [c for c in costs if c is not None]
            smallest = max(known) if len(known) == len(costs) else None
            if smallest is not None and smallest <= spare + EPS_MS:
                self.k = self.max_k
                return True
        self.k = MIN_BLOCK_SIZE
        never_fits = smallest is None or smallest + decode > self.budget_ms + EPS_MS
        return never_fits and is_fresh  # a probe, or the floor: once, right after a classic service

    def _choose_k(self, num_rows: int, spare_ms: float) -> int | None:
        """The widest unmeasured K that fits, else the fitting K with the most expected tokens per ms."""
        fitting = []
        for k in range(MIN_BLOCK_SIZE, self.max_k + 1):
            cost = self.round.estimate((k, num_rows))
            if cost is not None and cost <= spare_ms + EPS_MS:
                fitting.append((k, cost))
        unmeasured = [k for k, _ in fitting if (k, num_rows) not in self.round]
        if unmeasured:
            return max(unmeasured)
        if not fitting:
            return None
        return max(fitting, key=lambda kc: (self.expected_tokens(kc[0]) / max(kc[1], EPS_MS), kc[0]))[0]

    def expected_tokens(self, k: int) -> float:
        """Tokens one round of width K emits if each draft is accepted with the measured rate."""
        a = (self.num_accepted + 1) / (self.num_accepted + self.num_missed + 2)  # prior: 1/2
        return float(k) if a >= 1.0 else (1.0 - a ** k) / (1.0 - a)

    # -- learning -------------------------------------------------------------
    def observe(self, plan: Plan, spec_rows: Sequence[str], record: TickRecord, sched: SchedulerView) -> None:
        """Learn from one committed tick (before its finished rows are finalized)."""
        self._tick += 1
        self.now_ms = record.end_ms
        if record.action is ActionKind.DECODE:
            self.decode.observe((len(record.request_ids),), record.wall_ms)
        if record.action is ActionKind.DECODE or record.kind is TickKind.ADMIT:
            for seq_id in record.request_ids:
                self._served[seq_id] = (self._tick, record.end_ms)
        elif record.kind is TickKind.CHUNK and not plan.job_ids:  # rows whose prompt is now all in
            for row in plan.prefills:
                if row.is_last:
                    self._served[row.seq_id] = (self._tick, record.end_ms)
        for book in (self._served, self._seen_accepted):
            for seq_id in [s for s in book if s not in sched.requests]:
                del book[seq_id]  # rows finalized since
        if not spec_rows:
            return
        self._last_spec_tick = self._tick
        if record.action is ActionKind.SPEC_ROUND and plan.kind in (TickKind.ROUND, TickKind.GRANT):
            k = plan.verifies[0].k if plan.verifies else self.k
            self.round.observe((k, len(spec_rows)), record.wall_ms)
            self.k_log.append(k)
            self._count_acceptance(sched, spec_rows, k)
        elif record.kind is TickKind.CHUNK:
            self.slice0.observe((max(sum(record.prefill_tokens), 1),), record.wall_ms)
        elif record.kind in (TickKind.SLICE0, TickKind.WINDOW) or record.action is ActionKind.SPEC_ROUND:
            tokens = sum(len(sched.requests[i].prompt_token_ids) for i in spec_rows if i in sched.requests)
            self.slice0.observe((max(tokens, 1),), record.wall_ms)

    def _count_acceptance(self, sched: SchedulerView, seq_ids: Sequence[str], k: int) -> None:
        for seq_id in seq_ids:
            stats = sched.spec_stats(seq_id)
            if stats is None:
                continue
            total = stats.accepted
            accepted, self._seen_accepted[seq_id] = total - self._seen_accepted.get(seq_id, 0), total
            self.num_accepted += accepted
            self.num_missed += accepted < k - 1


def _next_jobs(sched: SchedulerView) -> list[SpecJob]:
    """The job the next speculative action serves (any backlog entry, if a grant is due)."""
    return [sched.job] if sched.job is not None else list(sched.backlog)


def _num_rows(sched: SchedulerView) -> int:
    return max((len(j.live_rows) for j in _next_jobs(sched)), default=1) or 1


def _slice0_tokens(job: SpecJob, chunk_tokens: int) -> int:
    """Prompt tokens the job's next slice 0 tick prefills: the rest of its prompts, or one chunk."""
    rest = sum(len(r.prompt_token_ids) - r.num_prefilled for r in job.rows)
    return min(rest, chunk_tokens) if chunk_tokens > 0 else rest
