"""Every mode's bound on classic inter-token gaps, in one place, and the cost terms they use.

Bounds come from the cost model's terms (decode step at the batch size, one round,
the request's slice 0, a prefill tick's spans), never from measured tick maxima, which would absorb the very
burst they exist to catch; with a real backend and no cost model the terms are the
measured decode and round ticks (never a burst) with a real-time allowance.
- slice (and burst, where it must fail): every classic gap <= decode + one round, + one round
  per Prefill action after the gap's first round (unchunked: each clears the yield flag), + the
  admission work inside the gap (a slice 0, another row's prefill);
- every sliced mode: no speculative request ran more rounds than slices after slice 0
  (`rounds_per_slice`, counts: it needs no clock);
- fused: every classic gap <= one fused step (drafting + one forward of the classic rows
  and the K verify positions of each speculative row), + the admission work;
- cost: every classic gap <= `hol_budget_ms`, unless admissions inside the gap (+ the
  decode) already exceed it, or the budget is below the floor (a decode + the smallest
  round), which the arbiter cannot beat and then alternates at;
- chunked prefill (`prefill_stall`, every mode): every classic gap <= a decode step + one
  chunk + one speculative action where a round ran in the gap. Each chunk tick inside a gap
  is admission work at its own priced cost, a batched admission at its prompts' one forward.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from coopsched.core.modes.cost import MIN_BLOCK_SIZE
from coopsched.core.types import ActionKind, TickKind
from harness.run import metrics
from harness.verdict.check import Check

EPS_MS = 1e-6
REAL_TIME_ALLOWANCE = 1.5  # real clocks get the 1.5x allowance; virtual time is exact


def check(name: str, holds: bool | None, value, bound, expect: str = "pass", note: str = "") -> Check:
    """A bound's verdict; holds=None means skipped, `note` then says why (never a pass)."""
    if holds is None:
        return Check.skip(name, note, expect)
    return Check(name, bool(holds), value, bound, expect, note)


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
        if t.kind is TickKind.CHUNK or t.kind is TickKind.MIXED:  # a mixed tick's chunk; its decode is a gap's
            spans = [(n, run.by_id(rid).served_speculatively) for rid, n in zip(t.request_ids, t.prefill_tokens) if n]
        elif t.kind is TickKind.ADMIT and len(t.request_ids) > 1:
            spans = [(len(run.by_id(rid).prompt_token_ids), False) for rid in t.request_ids]
        else:
            continue
        out[i] = cost.prefill_batch(spans, shared=t.kind is TickKind.MIXED) if cost is not None else t.wall_ms
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
    widest = widest_job(run)
    k = run.config.block_size
    if run.cost is not None:
        cost = run.cost
        prompt = {r.id: len(r.prompt_token_ids) for r in run.requests}
        slice0 = {rid: sum(cost.slice0(prompt[i]) for i in ids) for rid, ids in windows.items()}
        prefill = {rid: cost.prefill(n) for rid, n in prompt.items()}
        tick_ms = prefill_ticks(run, cost)
        # a round between classic steps also pays the path switch into it and out of it
        batch, longest = largest_decode_batch(run), longest_context(run)
        return Terms(cost.decode(batch) + cost.context(batch * longest),
                     cost.round(k, widest) + cost.context(widest * k * longest) + 2 * cost.switch_ms, slice0,
                     prefill, cost.max_jitter_factor, tick_ms, spec_chunks(run, tick_ms))
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


def longest_context(run) -> int:
    """The most tokens any row can hold in its cache: what a profile's context term is priced at."""
    return max((len(r.prompt_token_ids) + r.max_tokens for r in run.requests), default=0)


def largest_decode_batch(run) -> int:
    """The most classic rows one decode step served (the batch a classic gap's decode is priced at)."""
    return max((len(t.request_ids) for t in run.ticks if t.kind is TickKind.DECODE), default=_num_classic_rows(run))


def gap_ticks(run, kinds):
    """For every classic inter-token gap (a, b): (b - a, the ticks of those kinds inside it, by index)."""
    picked = [i for i, t in enumerate(run.ticks) if t.kind in kinds]
    ends = [run.ticks[i].end_ms for i in picked]  # ticks end in order: a gap's ticks are one slice
    for r in run.requests:
        if r.served_speculatively:
            continue
        for a, b in metrics.gap_spans(run.token_times[r.id]):
            yield b - a, picked[bisect_right(ends, a): bisect_right(ends, b)]


ADMISSIONS = frozenset({TickKind.SLICE0, TickKind.WINDOW, TickKind.BURST, TickKind.ADMIT, TickKind.CHUNK,
                        TickKind.MIXED})
SPEC_ACTIONS = (ActionKind.SPEC_ROUND, ActionKind.FUSED)  # they set the yield flag


def classic_gaps(run, terms: Terms, skip=frozenset()):
    """Every classic inter-token gap (ms) with the admission work inside it: slice 0s, classic
    prefills, chunks (each a tick's own prefill, classic or speculative, a mixed step's too), but not
    ticks of the kinds in `skip`; the rounds it earned; and its ticks."""
    ticks, priced = run.ticks, terms.tick_ms
    for gap, inside in gap_ticks(run, ADMISSIONS | ROUND_KINDS | {TickKind.PARK}):
        work = [i for i in inside if ticks[i].kind in ADMISSIONS and ticks[i].kind not in skip]
        whole = [ticks[i] for i in work if i not in priced]
        extra = sum(terms.slice0_ms.get(t.request_ids[0], 0.0) for t in whole if t.kind.is_spec_admission)
        extra += sum(terms.prefill_ms.get(t.request_ids[0], 0.0) for t in whole if t.kind is TickKind.ADMIT)
        extra += sum(priced[i] for i in work if i in priced)
        yield gap, extra, earned_rounds([ticks[i] for i in inside]), [ticks[i] for i in inside]


def earned_rounds(ticks) -> int:
    """Prefill actions after a gap's first speculative action: the decode before the gap left the yield
    flag clear, and (unchunked) each such Prefill (an admission, the queue head's slice 0, a parked
    waiter) clears it again, so one more round may follow it; a Prefill before any round earns none."""
    first = next((k for k, t in enumerate(ticks) if t.action in SPEC_ACTIONS), len(ticks))
    return sum(t.action is ActionKind.PREFILL for t in ticks[first + 1:])


def classic_gap_check(run, terms: Terms, spec_actions_per_gap: int) -> Check:
    """Every classic gap <= decode + A rounds, + slice 0 at admission (a speculative prompt's slice 0
    counts only in the gap that holds it), + one round per Prefill action after the gap's first
    round when prefill is not chunked: each clears the yield flag again (upstream's rule).

    Classic admissions inside a gap (other rows' prefills) are classic work and add their cost.
    """
    expect = "pass" if run.config.is_sliced else "fail"
    earns = 0 if run.config.is_chunked else 1  # chunked: a prefill keeps the flag while decode rows wait
    worst = worst_gap((gap, (terms.decode_ms + (spec_actions_per_gap + earns * earned) * terms.round_ms + extra)
                       * terms.factor) for gap, extra, earned, _ in classic_gaps(run, terms))
    if worst is None:
        return check("classic_itl", None, None, None, expect, "no classic gaps")
    return check("classic_itl", worst[0] <= worst[1] + EPS_MS, worst[0], worst[1], expect,
                 f"decode + {spec_actions_per_gap} round(s) (+ 1 per unchunked Prefill after a round in the gap), "
                 "+ slice 0 at admission")


def mixed_step_ms(run, chunk_tokens: int) -> float:
    """One mixed step: a chunk and a decode step of its largest batch in one forward (priced), or on a
    real clock the longest mixed tick measured."""
    mixed = [t for t in run.ticks if t.kind is TickKind.MIXED]
    if run.cost is None:
        return max((t.wall_ms for t in mixed), default=0.0)
    rows = max((sum(n == 0 for n in t.prefill_tokens) for t in mixed), default=largest_decode_batch(run))
    return run.cost.mixed(chunk_tokens, rows)


def mixed_gap_check(run, terms: Terms, chunk_tokens: int) -> Check:
    """Every classic gap with a mixed step in it <= one mixed step of `chunk_tokens` (+ a round where a
    round ran in the gap, + one per Prefill after it), + the admission work inside it. A whole-prompt
    prefill beside the decode rows in place of the chunk fails it."""
    expect = "pass" if run.config.is_sliced else "fail"
    step = mixed_step_ms(run, chunk_tokens)
    pairs = [(gap, (step + extra + ((1 + earned) * terms.round_ms if any(t.action in SPEC_ACTIONS for t in inside)
                                    else 0.0)) * terms.factor)
             for gap, extra, earned, inside in classic_gaps(run, terms, skip={TickKind.MIXED})
             if any(t.kind is TickKind.MIXED for t in inside)]
    worst = worst_gap(pairs)
    if worst is None:
        return check("mixed_step", None, None, None, expect, "no mixed step ran (mixed_step = true, slice or burst)")
    return check("mixed_step", worst[0] <= worst[1] + EPS_MS, worst[0], worst[1], expect,
                 f"one mixed step ({step:.3f} ms: a {chunk_tokens}-token chunk + decode, one forward), "
                 "+ a round where one ran, + admissions")


def prefill_grant_check(run, terms: Terms, chunk_tokens: int) -> Check:
    """Upstream's grant bound: a classic prompt prefilled in C chunks beside decode rows has its first
    token within C chunks + (C - 1) grant cycles of `prefill_grant_interval` decode steps (each with a
    round beside it, + one, where rounds ran) from its first chunk: C x (interval x D + P) for
    decode D and chunk P, doubled ticks under a speculative slice. Interval 0 has no bound."""
    interval = run.config.prefill_grant_interval
    if interval == 0:
        return check("prefill_grant", None, None, None, note="interval 0: a chunked prompt waits for the batch")
    ticks = run.ticks
    chunked: dict[str, list[int]] = {}
    for i, t in enumerate(ticks):
        if t.kind in (TickKind.CHUNK, TickKind.MIXED):
            for rid, n in zip(t.request_ids, t.prefill_tokens):
                if n and not run.by_id(rid).served_speculatively:
                    chunked.setdefault(rid, []).append(i)
    is_mixed = any(t.kind is TickKind.MIXED for t in ticks)
    chunk = mixed_step_ms(run, chunk_tokens) if is_mixed else chunk_ms(run, terms, chunk_tokens, False)
    pairs = []
    for rid, idx in chunked.items():
        times = run.token_times[rid]
        if len(idx) < 2 or not times:
            continue
        start = ticks[idx[0]].start_ms
        spec = any(t.action in SPEC_ACTIONS and start <= t.start_ms < times[0] for t in ticks[idx[0]:idx[-1]])
        cycle = interval * terms.decode_ms + ((interval + 1) * terms.round_ms if spec else 0.0)
        pairs.append((times[0] - start, (len(idx) * chunk + (len(idx) - 1) * cycle) * terms.factor))
    worst = worst_gap(pairs)
    if worst is None:
        return check("prefill_grant", None, None, None, note="no classic prompt was chunked")
    return check("prefill_grant", worst[0] <= worst[1] + EPS_MS, worst[0], worst[1],
                 note=f"a chunked prompt's first token within C x ({interval} x decode + chunk) of its first chunk "
                      "(with a round beside each, + 1, where rounds ran)")


def _num_classic_rows(run) -> int:
    num_classic = sum(not r.served_speculatively for r in run.requests)
    return max(min(num_classic, run.config.max_batch_size), 1)


def fused_step_ms(run) -> float:
    """One fused tick: K-1 drafts, then ONE forward of width classic rows + widest job x K."""
    k = run.config.block_size
    if run.cost is None:  # real backend: the longest fused tick measured
        return max((t.wall_ms for t in run.ticks if t.action is ActionKind.FUSED), default=0.0)
    # priced as the backend computes it (CostModel.fused_padding), after at most one path switch
    classic, widest = _num_classic_rows(run), widest_job(run)
    context = run.cost.context((classic + widest * k) * longest_context(run))
    return run.cost.fused_step(classic, k, widest) + context + run.cost.switch_ms


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
    widest = widest_job(run)
    context = run.cost.context(widest * MIN_BLOCK_SIZE * longest_context(run))
    return terms.decode_ms + run.cost.round(MIN_BLOCK_SIZE, widest) + context


def fused_gap_check(run, terms: Terms) -> Check:
    step = fused_step_ms(run)
    worst = worst_gap((gap, (step + extra) * terms.factor) for gap, extra, _, _ in classic_gaps(run, terms))
    if worst is None:
        return check("classic_itl", None, None, None, note="no classic gaps")
    return check("classic_itl", worst[0] <= worst[1] + EPS_MS, worst[0], worst[1],
                 note=f"one fused step ({step:.3f} ms), + slice 0 / prefill at admission")


def budget_gap_check(run, terms: Terms) -> Check:
    budget = run.config.hol_budget_ms
    floor = budget_floor_ms(run, terms)
    worst = worst_gap((gap, max(budget, terms.decode_ms + extra, floor) * terms.factor)
                   for gap, extra, _, _ in classic_gaps(run, terms))
    if worst is None:
        return check("classic_itl", None, None, None, note="no classic gaps")
    note = f"hol budget {budget:g} ms" + (f" (below the floor {floor:.3f} ms)" if floor > budget else "")
    return check("classic_itl", worst[0] <= worst[1] + EPS_MS, worst[0], worst[1],
                 note=note + ", or admissions + decode when they alone exceed it")


GAP_BOUNDS = {"fused": fused_gap_check, "cost": budget_gap_check}  # slice, burst: classic_gap_check


ROUND_KINDS = frozenset({TickKind.ROUND, TickKind.GRANT, TickKind.FUSED, TickKind.SLICE0})
SPEC_PREFILL_KINDS = frozenset({TickKind.SLICE0, TickKind.WINDOW, TickKind.CHUNK, TickKind.BURST})


def chunk_ms(run, terms: Terms, num_tokens: int, with_draft: bool) -> float:
    """One full chunk: priced, or on a real clock the costliest prefill tick of at most that many tokens."""
    if run.cost is not None:
        return run.cost.chunk(num_tokens, with_draft)
    return max([ms for i, ms in terms.tick_ms.items() if sum(run.ticks[i].prefill_tokens) <= num_tokens],
               default=0.0)


def prefill_stall_check(run, terms: Terms, chunk_tokens: int) -> Check:
    """Every classic gap <= a decode step + one chunk of `chunk_tokens` (with the drafter when a
    speculative prefill ran in the gap) + one speculative action where a round ran in it (cost
    mode: its budget's worth). Without chunking the whole prefill sits in one gap and it fails."""
    expect = "pass" if run.config.is_sliced else "fail"
    if chunk_tokens <= 0:
        return check("prefill_stall", None, None, None, expect, "no chunk size: set chunk_tokens or chunking")
    spec_ms = spec_action_ms(run, terms)[0]
    if run.config.mode == "cost":
        spec_ms = max(spec_ms, run.config.hol_budget_ms - terms.decode_ms)
    ticks, pairs, stalled = run.ticks, [], False
    upstream = run.scheduler.policy.follows_upstream
    for gap, inside in gap_ticks(run, ROUND_KINDS | SPEC_PREFILL_KINDS | {TickKind.ADMIT, TickKind.MIXED}):
        if any(ticks[i].kind is TickKind.MIXED for i in inside):
            continue  # a mixed step's gap: mixed_gap_check bounds it (its chunk rides with the decode)
        spec_prefill = any(ticks[i].kind in SPEC_PREFILL_KINDS and
                           run.by_id(ticks[i].request_ids[0]).served_speculatively for i in inside)
        stalled |= spec_prefill
        has_round = any(ticks[i].kind in ROUND_KINDS and ticks[i].action is not ActionKind.PREFILL for i in inside)
        # upstream's rule: a Prefill (a granted chunk) after a round clears the flag, so another round follows it
        rounds = 1 + (earned_rounds([ticks[i] for i in inside]) if upstream else 0) if has_round else 0
        bound = terms.decode_ms + chunk_ms(run, terms, chunk_tokens, spec_prefill) + rounds * spec_ms
        pairs.append((gap, bound * terms.factor))
    worst = worst_gap(pairs)
    if worst is None:
        return check("prefill_stall", None, None, None, expect, "no classic gaps")
    if expect == "fail" and not stalled:  # e.g. a fast cost profile: the classic rows were done before it came
        return check("prefill_stall", None, None, None, expect,
                     "no speculative prefill ran inside a classic gap: the burst had no classic row to stall")
    return check("prefill_stall", worst[0] <= worst[1] + EPS_MS, worst[0], worst[1], expect,
                 f"decode + one {chunk_tokens}-token chunk (+ one speculative action where a round ran)")
