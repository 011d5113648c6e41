"""Every mode's bound on classic inter-token gaps, in one place, and the cost terms they use.

Bounds come from the cost model's terms (decode step at the batch size, one round,
the request's slice 0), never from measured tick maxima, which would absorb the very
burst they exist to catch; with a real backend and no cost model the terms are the
measured decode and round ticks (never a burst) with a real-time allowance.
- slice (and burst, where it must fail): every classic gap <= decode + one speculative
  action, + the admission work inside the gap (a slice 0, another row's prefill);
- fused: every classic gap <= one fused step (drafting + one forward of the classic rows
  and the K verify positions of each speculative row), + the admission work;
- cost: every classic gap <= `hol_budget_ms`, unless admissions inside the gap (+ the
  decode) already exceed it, or the budget is below the floor (a decode + the smallest
  round), which the arbiter cannot beat and then alternates at.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from coopsched.core.modes.cost import MIN_BLOCK_SIZE
from coopsched.core.types import ActionKind, TickKind
from harness.run import metrics

EPS_MS = 1e-6
REAL_TIME_ALLOWANCE = 1.5  # real clocks get the 1.5x allowance; virtual time is exact


def check(name: str, holds: bool | None, value, bound, expect: str = "pass", note: str = "") -> dict:
    """A check record; holds=None means skipped (not a failure)."""
    if holds is None:
        return {"name": name, "ok": True, "skipped": True, "value": None, "bound": None,
                "expect": expect, "note": note}
    value = round(value, 6) if isinstance(value, float) else value
    bound = round(bound, 6) if isinstance(bound, float) else bound
    return {"name": name, "ok": bool(holds) == (expect == "pass"), "holds": bool(holds),
            "value": value, "bound": bound, "expect": expect, "note": note}


@dataclass(frozen=True)
class Terms:
    """The cost terms bounds are built from, for one run."""
    decode_ms: float      # a decode step at the largest classic batch
    round_ms: float       # one round at the widest speculative job
    slice0_ms: dict       # per speculative request: its job's slice 0
    prefill_ms: dict      # per classic request: its admission (classic work, not HOL)
    factor: float         # jitter or real-time allowance

    @property
    def spec_action_ms(self) -> float:
        return max([self.round_ms, *self.slice0_ms.values()])


def widest_job(run) -> int:
    """Rows in the widest speculative job the run admitted (1 unless a B > 1 window ran)."""
    return max((len(t.request_ids) for t in run.ticks if t.kind.is_spec_admission), default=1)


def worst_gap(pairs) -> tuple[float, float] | None:
    """The (gap, bound) pair that exceeds its bound the most (or comes closest)."""
    return max(pairs, key=lambda p: p[0] - p[1], default=None)


def terms_of(run) -> Terms:
    windows = {rid: t.request_ids for t in run.ticks if t.kind.is_spec_admission
               for rid in t.request_ids}
    num_classic = sum(not r.served_speculatively for r in run.requests)
    widest = widest_job(run)
    k = run.config.block_size
    if run.cost is not None:
        cost = run.cost
        prompt = {r.id: len(r.prompt_token_ids) for r in run.requests}
        slice0 = {rid: sum(cost.slice0(prompt[i]) for i in ids) for rid, ids in windows.items()}
        prefill = {rid: cost.prefill(n) for rid, n in prompt.items()}
        return Terms(cost.decode(max(num_classic, 1)), cost.round(k, widest), slice0, prefill,
                     cost.max_jitter_factor)
    # Real backend with no cost model: the classic and round terms from decode and round
    # ticks (never prefill ticks, where a burst hides), with the real-time allowance.
    walls = lambda action: [t.wall_ms for t in run.ticks if t.action is action and t.kind is not TickKind.BURST]
    decode = max(walls(ActionKind.DECODE), default=0.0)
    round_ms = max(walls(ActionKind.SPEC_ROUND), default=0.0)
    slice0: dict[str, float] = {}
    for t in run.ticks:
        if t.kind in (TickKind.SLICE0, TickKind.WINDOW):  # a window's admission prefills all of its rows
            for rid in t.request_ids:
                slice0[rid] = max(slice0.get(rid, 0.0), t.wall_ms)
    prefill = {t.request_ids[0]: t.wall_ms for t in run.ticks if t.kind is TickKind.ADMIT}
    return Terms(decode, round_ms, slice0, prefill, REAL_TIME_ALLOWANCE)


def classic_gaps(run, terms: Terms):
    """Every classic inter-token gap (ms) with the admission work inside it (slice 0s, classic prefills)."""
    admissions = [t for t in run.ticks if t.kind.is_spec_admission or t.kind is TickKind.ADMIT]
    ends = [t.end_ms for t in admissions]  # ticks end in order: a gap's ticks are one slice
    for r in run.requests:
        if r.served_speculatively:
            continue
        times = run.token_times[r.id]
        for a, b in metrics.gap_spans(times):
            inside = admissions[bisect_right(ends, a): bisect_right(ends, b)]
            extra = sum(terms.slice0_ms.get(t.request_ids[0], 0.0) for t in inside if t.kind.is_spec_admission)
            extra += sum(terms.prefill_ms.get(t.request_ids[0], 0.0) for t in inside if t.kind is TickKind.ADMIT)
            yield b - a, extra


def classic_gap_check(run, terms: Terms, spec_actions_per_gap: int) -> dict:
    """Every classic gap <= decode + A x (one speculative action), + slice 0 once at admission.

    Classic admissions inside a gap (other rows' prefills) are classic work and add their cost.
    """
    expect = "pass" if run.config.is_sliced else "fail"
    base = terms.decode_ms + spec_actions_per_gap * terms.spec_action_ms
    worst = worst_gap((gap, (base + extra) * terms.factor) for gap, extra in classic_gaps(run, terms))
    if worst is None:
        return check("classic_itl", None, None, None, expect, "no classic gaps")
    return check("classic_itl", worst[0] <= worst[1] + EPS_MS, worst[0], worst[1], expect,
                 f"decode + {spec_actions_per_gap} spec action(s), + slice 0 at admission")


def _num_classic_rows(run) -> int:
    num_classic = sum(not r.served_speculatively for r in run.requests)
    return max(min(num_classic, run.config.max_batch_size), 1)


def fused_step_ms(run) -> float:
    """One fused tick: K-1 drafts, then ONE forward of width classic rows + widest job x K."""
    k = run.config.block_size
    if run.cost is None:  # real backend: the longest fused tick measured
        return max((t.wall_ms for t in run.ticks if t.action is ActionKind.FUSED), default=0.0)
    return run.cost.draft(k - 1) + run.cost.decode(_num_classic_rows(run) + widest_job(run) * k)


def spec_action_ms(run, terms: Terms) -> tuple[float, str]:
    """The longest speculative tick but slice 0: one round, or in fused mode a fused step
    (which also decodes the classic rows, so it may outlast a lone round)."""
    if run.config.mode == "fused":
        return max(terms.round_ms, fused_step_ms(run)), "one round or fused step"
    return terms.round_ms, "one round"


def budget_floor_ms(run, terms: Terms) -> float:
    """The smallest classic gap with any speculation in it: a decode + the smallest round."""
    if run.cost is None:
        return terms.decode_ms + terms.round_ms
    return terms.decode_ms + run.cost.round(MIN_BLOCK_SIZE, widest_job(run))


def fused_gap_check(run, terms: Terms) -> dict:
    step = fused_step_ms(run)
    worst = worst_gap((gap, (step + extra) * terms.factor) for gap, extra in classic_gaps(run, terms))
    if worst is None:
        return check("classic_itl", None, None, None, note="no classic gaps")
    return check("classic_itl", worst[0] <= worst[1] + EPS_MS, worst[0], worst[1],
                 note=f"one fused step ({step:.3f} ms), + slice 0 / prefill at admission")


def budget_gap_check(run, terms: Terms) -> dict:
    budget = run.config.hol_budget_ms
    floor = budget_floor_ms(run, terms)
    worst = worst_gap((gap, max(budget, terms.decode_ms + extra, floor) * terms.factor)
                   for gap, extra in classic_gaps(run, terms))
    if worst is None:
        return check("classic_itl", None, None, None, note="no classic gaps")
    note = f"hol budget {budget:g} ms" + (f" (below the floor {floor:.3f} ms)" if floor > budget else "")
    return check("classic_itl", worst[0] <= worst[1] + EPS_MS, worst[0], worst[1],
                 note=note + ", or admissions + decode when they alone exceed it")


GAP_BOUNDS = {"fused": fused_gap_check, "cost": budget_gap_check}  # slice, burst: classic_gap_check
