"""The bounds of the modes beyond upstream: fused (one forward) and cost (a time budget).

Built from cost terms like every bound (DESIGN.md section 6):
- fused: every classic gap <= one fused step (drafting + one forward of the classic
  rows and the K verify positions of each speculative row), plus the admission
  work inside that gap (a slice 0 or a classic prefill, which stall every mode);
- cost: every classic gap <= `hol_budget_ms`, unless admissions inside the gap
  (+ the decode) already exceed it, or the budget is below the floor (a decode +
  the smallest round), which the arbiter cannot beat and then alternates at;
- throughput: fused mode's aggregate tokens/s >= min_ratio (0.95) x the legacy
  burst's in the same run, gated in virtual time only (a real clock's ratio is
  reported, as every wall-time figure); every mode's ratio is recorded for the tables.
"""

from __future__ import annotations

from coopsched.core.modes.cost import MIN_BLOCK_SIZE
from coopsched.core.types import ActionKind
from harness.run import metrics
from harness.run.checks import EPS_MS, Terms, check, classic_gaps, widest_job, worst_gap

DEFAULT_MIN_RATIO = 0.95


def _num_classic_rows(run) -> int:
    num_classic = sum(not r.served_speculatively for r in run.requests)
    return max(min(num_classic, run.config.max_batch_size), 1)


def fused_step_ms(run) -> float:
    """One fused tick: K-1 drafts, then ONE forward of width classic rows + widest job x K."""
    k = run.config.block_size
    if run.cost is None:  # real backend: the longest fused tick measured
        return max((t.wall_ms for t in run.ticks if t.action is ActionKind.FUSED), default=0.0)
    # priced as the backend computes it (CostModel.fused_padding), after at most one path switch
    return run.cost.fused_step(_num_classic_rows(run), k, widest_job(run)) + run.cost.switch_ms


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


GAP_CHECKS = {"fused": fused_gap_check, "cost": budget_gap_check}


def aggregate_tok_s(run) -> float | None:
    requests = [{"arrival_ms": r.arrival_ms, "token_times_ms": run.token_times[r.id],
                 "token_ids": r.output_token_ids, "speculative": r.served_speculatively}
                for r in run.requests]
    return metrics.throughput(requests)["aggregate_tok_s"]


def throughput_checks(run, burst) -> list[dict]:
    """Record the ratio to the legacy burst (trace key `ratio_to_burst`); fused mode must keep >= 0.95."""
    if run.config.mode == "burst":
        run.extra["ratio_to_burst"] = 1.0
        return []
    mine, legacy = aggregate_tok_s(run), (aggregate_tok_s(burst) if burst is not None else None)
    ratio = mine / legacy if mine and legacy else None
    run.extra["ratio_to_burst"] = None if ratio is None else round(ratio, 6)
    if run.config.mode != "fused":
        return []
    min_ratio = run.scenario.checks.get("throughput_vs_burst", {}).get("min_ratio", DEFAULT_MIN_RATIO)
    if ratio is None:
        return [check("throughput_vs_burst", None, None, None, note="no throughput to compare")]
    if run.clock_kind != "virtual":  # wall time on a shared CPU is reported, never gated
        return [check("throughput_vs_burst", None, None, None,
                      note=f"real clock: ratio {ratio:.3f} reported in the table, not gated")]
    return [check("throughput_vs_burst", ratio >= min_ratio - EPS_MS, ratio, min_ratio,
                  note=f"aggregate tok/s {mine:.1f} vs legacy burst {legacy:.1f}")]
