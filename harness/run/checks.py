"""The checks a scenario asserts, each with the mode-dependent expectation it must meet.

Bounds come from the cost model's terms (decode step at the batch size, one
round, the request's slice 0, a prefill tick's spans), never from measured tick
maxima, which would absorb the very burst they exist to catch. A check that
guards against the legacy burst is *expected to fail* in burst mode; `ok`
means the expectation was met.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from dataclasses import dataclass, field

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
    tick_ms: dict = field(default_factory=dict)        # tick index -> a chunk tick's or batched admission's prefill
    spec_chunk_ms: dict = field(default_factory=dict)  # per speculative request: its costliest chunk of slice 0

    @property
    def spec_action_ms(self) -> float:
        return max([self.round_ms, *self.slice0_ms.values()])


def is_job_admission(run, tick) -> bool:
    """A tick that admitted a speculative job: its slice 0 whole, or the first chunk of it."""
    return tick.kind.is_spec_admission or (tick.kind is TickKind.CHUNK and tick.action is ActionKind.PREFILL
                                           and run.by_id(tick.request_ids[0]).served_speculatively)


def widest_job(run) -> int:
    """Rows in the widest speculative job the run admitted (1 unless a B > 1 window ran)."""
    return max((len(t.request_ids) for t in run.ticks if is_job_admission(run, t)), default=1)


def prefill_ticks(run, cost) -> dict:
    """Tick index -> the prefill of a chunk tick or a batched admission: priced from its spans
    (a speculative row's chunk also feeds the drafter), or its wall on a real clock."""
    out = {}
    for i, t in enumerate(run.ticks):
        if t.kind is TickKind.CHUNK:
            spans = [(n, run.by_id(rid).served_speculatively) for rid, n in zip(t.request_ids, t.prefill_tokens) if n]
        elif t.kind is TickKind.ADMIT and len(t.request_ids) > 1:
            spans = [(len(run.by_id(rid).prompt_token_ids), False) for rid in t.request_ids]
        else:
            continue
        out[i] = cost.prefill_batch(spans) if cost is not None else t.wall_ms
    return out


def spec_chunks(run, tick_ms: dict) -> dict:
    """Per speculative request: its costliest chunk tick (the longest it held the classic rows)."""
    out: dict[str, float] = {}
    for i, ms in tick_ms.items():
        t = run.ticks[i]
        for rid in t.request_ids if t.kind is TickKind.CHUNK else ():
            if run.by_id(rid).served_speculatively:
                out[rid] = max(out.get(rid, 0.0), ms)
    return out


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
        tick_ms = prefill_ticks(run, cost)
        return Terms(cost.decode(max(num_classic, 1)), cost.round(k, widest), slice0, prefill,
                     cost.max_jitter_factor, tick_ms, spec_chunks(run, tick_ms))
    # Real backend with no cost model: the classic and round terms from decode and round
    # ticks (never prefill ticks, where a burst hides), with the real-time allowance.
    walls = lambda action: [t.wall_ms for t in run.ticks
                            if t.action is action and t.kind not in (TickKind.BURST, TickKind.CHUNK)]
    decode = max(walls(ActionKind.DECODE), default=0.0)
    round_ms = max(walls(ActionKind.SPEC_ROUND), default=0.0)
    slice0: dict[str, float] = {}
    for t in run.ticks:
        if t.kind in (TickKind.SLICE0, TickKind.WINDOW):  # a window's admission prefills all of its rows
            for rid in t.request_ids:
                slice0[rid] = max(slice0.get(rid, 0.0), t.wall_ms)
    prefill = {t.request_ids[0]: t.wall_ms for t in run.ticks if t.kind is TickKind.ADMIT}
    tick_ms = prefill_ticks(run, None)
    return Terms(decode, round_ms, slice0, prefill, REAL_TIME_ALLOWANCE, tick_ms, spec_chunks(run, tick_ms))


def gap_ticks(run, kinds):
    """For every classic inter-token gap (a, b): (b - a, the ticks of those kinds inside it, by index)."""
    picked = [i for i, t in enumerate(run.ticks) if t.kind in kinds]
    ends = [run.ticks[i].end_ms for i in picked]  # ticks end in order: a gap's ticks are one slice
    for r in run.requests:
        if r.served_speculatively:
            continue
        for a, b in itertools.pairwise(run.token_times[r.id]):
            yield b - a, picked[bisect_right(ends, a): bisect_right(ends, b)]


ADMISSIONS = frozenset({TickKind.SLICE0, TickKind.WINDOW, TickKind.BURST, TickKind.ADMIT, TickKind.CHUNK})


def classic_gaps(run, terms: Terms):
    """Every classic inter-token gap (ms) with the admission work inside it: slice 0s, classic
    prefills, chunks (each a tick's own prefill, classic or speculative)."""
    ticks, priced = run.ticks, terms.tick_ms
    for gap, inside in gap_ticks(run, ADMISSIONS):
        whole = [ticks[i] for i in inside if i not in priced]
        extra = sum(terms.slice0_ms.get(t.request_ids[0], 0.0) for t in whole if t.kind.is_spec_admission)
        extra += sum(terms.prefill_ms.get(t.request_ids[0], 0.0) for t in whole if t.kind is TickKind.ADMIT)
        extra += sum(priced[i] for i in inside if i in priced)
        yield gap, extra


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


ROUND_KINDS = frozenset({TickKind.ROUND, TickKind.GRANT, TickKind.FUSED, TickKind.SLICE0})
SPEC_PREFILL_KINDS = frozenset({TickKind.SLICE0, TickKind.WINDOW, TickKind.CHUNK, TickKind.BURST})


def chunk_ms(run, terms: Terms, num_tokens: int, with_draft: bool) -> float:
    """One full chunk: priced, or on a real clock the costliest prefill tick of at most that many tokens."""
    if run.cost is not None:
        return run.cost.chunk(num_tokens, with_draft)
    return max([ms for i, ms in terms.tick_ms.items() if sum(run.ticks[i].prefill_tokens) <= num_tokens],
               default=0.0)


def prefill_stall_check(run, terms: Terms, chunk_tokens: int) -> dict:
    """Every classic gap <= a decode step + one chunk of `chunk_tokens` (with the drafter when a
    speculative prefill ran in the gap) + one speculative action where a round ran in it (cost
    mode: its budget's worth). Without chunking the whole prefill sits in one gap and it fails."""
    from harness.run import mode_checks

    expect = "pass" if run.config.is_sliced else "fail"
    if chunk_tokens <= 0:
        return check("prefill_stall", None, None, None, expect, "no chunk size: set chunk_tokens or chunking")
    spec_ms = mode_checks.spec_action_ms(run, terms)[0]
    if run.config.mode == "cost":
        spec_ms = max(spec_ms, run.config.hol_budget_ms - terms.decode_ms)
    ticks, pairs = run.ticks, []
    for gap, inside in gap_ticks(run, ROUND_KINDS | SPEC_PREFILL_KINDS):
        spec_prefill = any(ticks[i].kind in SPEC_PREFILL_KINDS and
                           run.by_id(ticks[i].request_ids[0]).served_speculatively for i in inside)
        has_round = any(ticks[i].kind in ROUND_KINDS and ticks[i].action is not ActionKind.PREFILL for i in inside)
        bound = terms.decode_ms + chunk_ms(run, terms, chunk_tokens, spec_prefill) + (spec_ms if has_round else 0.0)
        pairs.append((gap, bound * terms.factor))
    worst = worst_gap(pairs)
    if worst is None:
        return check("prefill_stall", None, None, None, expect, "no classic gaps")
    return check("prefill_stall", worst[0] <= worst[1] + EPS_MS, worst[0], worst[1], expect,
                 f"decode + one {chunk_tokens}-token chunk (+ one speculative action where a round ran)")


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

    if "prefill_stall" in wanted:
        chunk_tokens = wanted["prefill_stall"].get("chunk_tokens", run.config.prefill_chunk_tokens)
        out.append(prefill_stall_check(run, terms, chunk_tokens))

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
            excess = [(b.burst_wall_ms, 1.05 * max(action_ms, terms.slice0_ms.get(b.seq_id, 0.0),
                                                   terms.spec_chunk_ms.get(b.seq_id, 0.0))
                       * terms.factor) for b in bursts.values()]
            value, bound = max(excess, key=lambda e: e[0] - e[1])
            chunked = " or one chunk of it" if terms.spec_chunk_ms else ""
            out.append(check("burst_wall", value <= bound + EPS_MS, value, bound,
                             note=f"<= 1.05 x max({action}, slice 0{chunked})"))
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
