"""The checks a scenario asserts, each with the mode-dependent expectation it must meet.

Bounds come from the cost model's terms (decode step at the batch size, one
round, the request's slice 0), never from measured tick maxima, which would
absorb the very burst they exist to catch (DESIGN.md section 6). A check that
guards against the legacy burst is *expected to fail* in burst mode; `ok`
means the expectation was met.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from dataclasses import dataclass

from coopsched.core.types import ActionKind, TickKind

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
        # a round between classic steps also pays the path switch into it and out of it
        return Terms(cost.decode(max(num_classic, 1)), cost.round(k, widest) + 2 * cost.switch_ms, slice0, prefill,
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
        for a, b in itertools.pairwise(times):
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


def evaluate(run, *, classic, burst) -> list[dict]:
    from harness.run import mode_checks

    wanted = run.scenario.checks
    legacy = not run.config.is_sliced  # burst mode, or a drafter kind that is never sliced
    spec = [r for r in run.requests if r.served_speculatively]
    bursts = {b.seq_id: b for b in run.scheduler.obs.bursts}
    terms = terms_of(run)
    out = []
    skip = None if spec else "no request was served speculatively under these gates"

    if "classic_itl" in wanted:
        per_gap = wanted["classic_itl"].get("spec_actions_per_gap", 1)
        if not spec:
            out.append(check("classic_itl", None, None, None, note=skip))
        elif run.config.mode in mode_checks.GAP_CHECKS and not legacy:  # fused, cost: their own bound
            out.append(mode_checks.GAP_CHECKS[run.config.mode](run, terms))
        else:
            out.append(classic_gap_check(run, terms, per_gap))
        if legacy and spec:
            stall = max((max((b - a for a, b in itertools.pairwise(t)), default=0.0)
                         for rid, t in run.token_times.items() if not run.by_id(rid).served_speculatively),
                        default=0.0)
            whole = max(b.burst_wall_ms for b in bursts.values())
            out.append(check("classic_stalled_by_burst", stall >= whole - EPS_MS, stall, whole,
                             note="the classic row waits out the whole burst"))

    if "burst_wall" in wanted:
        if not spec:
            out.append(check("burst_wall", None, None, None, note=skip))
        elif legacy:
            whole = all(abs(b.burst_wall_ms - b.burst_active_ms) < EPS_MS and b.slices == 1
                        for b in bursts.values())
            worst = max(bursts.values(), key=lambda b: b.burst_wall_ms)
            out.append(check("burst_wall", whole, worst.burst_wall_ms, worst.burst_active_ms,
                             note="legacy: one tick holds the whole request"))
        else:
            action_ms, action = mode_checks.spec_action_ms(run, terms)  # a round, or a fused step
            excess = [(b.burst_wall_ms, 1.05 * max(action_ms, terms.slice0_ms.get(b.seq_id, 0.0))
                       * terms.factor) for b in bursts.values()]
            value, bound = max(excess, key=lambda e: e[0] - e[1])
            out.append(check("burst_wall", value <= bound + EPS_MS, value, bound,
                             note=f"<= 1.05 x max({action}, slice 0)"))
            if burst is not None and burst.scheduler.obs.bursts:
                whole = max(b.burst_wall_ms for b in burst.scheduler.obs.bursts)
                out.append(check("burst_wall_vs_legacy", value <= whole / 5 + EPS_MS, value, whole / 5,
                                 note="at most a fifth of the legacy burst"))

    if "lump" in wanted:
        if not spec:
            out.append(check("spec_streaming", None, None, None, note=skip))
        else:
            lumps = {r.id: len(set(run.token_times[r.id])) for r in spec}
            if legacy:
                out.append(check("spec_streaming", max(lumps.values()) == 1, max(lumps.values()), 1,
                                 note="legacy: every token visible at once"))
            else:
                multi = [bursts[r.id].slices for r in spec if bursts[r.id].slices > 1]
                fewest = min((lumps[r.id] for r in spec if bursts[r.id].slices > 1), default=0)
                out.append(check("spec_streaming", bool(multi) and fewest >= 2, fewest, 2,
                                 note="streamed per round (distinct arrival times)"))

    if "rotation" in wanted:
        obs = run.scheduler.obs
        grants = [g for g in obs.grant_log if ":" not in g]
        if legacy or not spec:
            out.append(check("rotation", None, None, None, note="no rotation in a legacy burst"))
        else:
            out.append(check("rotation", len(grants) >= 3 and obs.waiter_parks >= 1, len(grants), 3,
                             note=f"grants; waiter parks (yield-flag quirk) = {obs.waiter_parks}"))

    if "window" in wanted:
        formed = sum(t.kind is TickKind.WINDOW or (t.kind is TickKind.BURST and len(t.request_ids) > 1)
                     for t in run.ticks)
        holds = None if not run.config.enable_batch else formed >= 1
        out.append(check("window", holds, formed, 1, note="a B > 1 speculative window ran"))

    out += mode_checks.throughput_checks(run, burst)
    if classic is not None:
        mismatched = [r.id for r in run.requests
                      if r.output_token_ids != classic.by_id(r.id).output_token_ids
                      or r.finish_reason != classic.by_id(r.id).finish_reason]
        out.append(check("parity", not mismatched, len(mismatched), 0,
                         note="tokens equal speculation forced off" + (f": {mismatched}" if mismatched else "")))
    leaked = run.scheduler.kv.num_in_use + getattr(run.backend, "num_live", 0)
    out.append(check("kv_released", leaked == 0, leaked, 0, note="slots and caches freed"))
    return out
