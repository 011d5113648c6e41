"""The checks `coopsched run` asserts on a scheduler run, registered by name (as modes are policies).

Each function takes the run's Context and returns a Check, or None where it does not apply in
this mode; CHECKS lists them in the order a trace shows them, each with the scenario [checks]
key that turns it on (None: every run) and what it guards against. Bounds: harness/run/bounds.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from coopsched.core.types import TickKind
from harness.run import metrics
from harness.run.bounds import (
    EPS_MS,
    GAP_BOUNDS,
    Terms,
    classic_gap_check,
    mixed_gap_check,
    prefill_grant_check,
    prefill_stall_check,
    spec_action_ms,
    terms_of,
)
from harness.verdict.check import FAIL, PASS, Check

DEFAULT_MIN_RATIO = 0.95


@dataclass(frozen=True)
class Context:
    """What the checks of one run read: the run, its reference runs and the terms its bounds use."""
    run: object
    classic: object | None     # the run with speculation forced off (parity), if it ran
    burst: object | None       # the legacy burst of the same scenario (ratios), if it ran
    terms: Terms
    legacy: bool               # burst mode, or a drafter kind that is never sliced
    spec: tuple                # the requests served speculatively
    bursts: dict               # seq_id -> its BurstFinalized record

    @classmethod
    def of(cls, run, classic=None, burst=None) -> Context:
        return cls(run, classic, burst, terms_of(run), not run.config.is_sliced,
                   tuple(r for r in run.requests if r.served_speculatively),
                   {b.seq_id: b for b in run.scheduler.obs.bursts})

    @property
    def wanted(self) -> dict:
        return self.run.scenario.checks

    def no_spec(self, name: str) -> Check | None:
        """The skip of a check that needs a speculative request, when the run had none."""
        return None if self.spec else Check.skip(name, why_no_speculation(self.run))


def why_no_speculation(run) -> str:
    """Why no request was served speculatively, naming the gate or setting that decided it."""
    if not any(r.speculative for r in run.requests):
        return "no request asked for speculation"
    reason = "no request was served speculatively"
    if not run.config.enable_b1:
        for where, gates in (("", os.environ), ("the scenario's gates: ", run.scenario.gates)):
            if "MLXCEL_ENABLE_MTP_B1" in gates:
                return f"{reason}: {where}MLXCEL_ENABLE_MTP_B1={gates['MLXCEL_ENABLE_MTP_B1']}"
        return f"{reason}: B = 1 speculation is off"
    return f"{reason} under these gates"


# -- the checks ------------------------------------------------------------------------
def classic_itl(ctx: Context) -> Check:
    if (skip := ctx.no_spec("classic_itl")) is not None:
        return skip
    if ctx.run.config.mode in GAP_BOUNDS and not ctx.legacy:  # fused, cost: their own bound
        return GAP_BOUNDS[ctx.run.config.mode](ctx.run, ctx.terms)
    return classic_gap_check(ctx.run, ctx.terms, ctx.wanted["classic_itl"].get("spec_actions_per_gap", 1))


def classic_stalled_by_burst(ctx: Context) -> Check | None:
    if not (ctx.legacy and ctx.spec):
        return None
    run = ctx.run
    stall = max((max(metrics.itl(t), default=0.0)
                 for rid, t in run.token_times.items() if not run.by_id(rid).served_speculatively), default=0.0)
    whole = max(b.burst_wall_ms for b in ctx.bursts.values())
    return Check("classic_stalled_by_burst", stall >= whole - EPS_MS, stall, whole,
                 note="the classic row waits out the whole burst")


def prefill_stall(ctx: Context) -> Check:
    chunk_tokens = ctx.wanted["prefill_stall"].get("chunk_tokens", ctx.run.config.prefill_chunk_tokens)
    return prefill_stall_check(ctx.run, ctx.terms, chunk_tokens)


def prefill_grant(ctx: Context) -> Check:
    chunk_tokens = ctx.wanted["prefill_grant"].get("chunk_tokens", ctx.run.config.prefill_chunk_tokens)
    return prefill_grant_check(ctx.run, ctx.terms, chunk_tokens)


def mixed_step(ctx: Context) -> Check | None:
    """Only where a mixed step may run: mixed_step on, in a mode that follows upstream's rule."""
    if not (ctx.run.config.mixed_step and ctx.run.scheduler.policy.follows_upstream):
        return None
    chunk_tokens = ctx.wanted["mixed_step"].get("chunk_tokens", ctx.run.config.prefill_chunk_tokens)
    return mixed_gap_check(ctx.run, ctx.terms, chunk_tokens)


def burst_wall(ctx: Context) -> Check:
    if (skip := ctx.no_spec("burst_wall")) is not None:
        return skip
    bursts, terms = ctx.bursts.values(), ctx.terms
    if ctx.legacy:
        whole = all(abs(b.burst_wall_ms - b.burst_active_ms) < EPS_MS and b.slices == 1 for b in bursts)
        worst = max(bursts, key=lambda b: b.burst_wall_ms)
        return Check("burst_wall", whole, worst.burst_wall_ms, worst.burst_active_ms,
                     note="legacy: one tick holds the whole request")
    value, bound = _sliced_burst_wall(ctx)
    action = spec_action_ms(ctx.run, terms)[1]
    chunked = " or one chunk of it" if terms.spec_chunk_ms else ""
    return Check("burst_wall", value <= bound + EPS_MS, value, bound,
                 note=f"<= 1.05 x max({action}, slice 0{chunked})")


def _sliced_burst_wall(ctx: Context) -> tuple[float, float]:
    """The burst that came closest to (or went furthest over) its bound: (burst_wall_ms, bound)."""
    terms = ctx.terms
    action_ms = spec_action_ms(ctx.run, terms)[0]  # a round, or a fused step
    excess = [(b.burst_wall_ms, 1.05 * max(action_ms, terms.slice0_ms.get(b.seq_id, 0.0),
                                           terms.spec_chunk_ms.get(b.seq_id, 0.0)) * terms.factor)
              for b in ctx.bursts.values()]
    return max(excess, key=lambda e: e[0] - e[1])


def rounds_per_slice(ctx: Context) -> Check | None:
    """Counts, not times: on a real clock without a cost model the burst_wall bound comes from the
    ticks themselves, and a tick that ran several rounds would set its own bound."""
    if ctx.legacy or not ctx.spec:
        return None
    most = max(ctx.bursts.values(), key=lambda b: b.rounds - b.slices)
    return Check("rounds_per_slice", most.rounds <= most.slices - 1, most.rounds, most.slices - 1,
                 note=f"{most.seq_id}: at most one round per slice after slice 0 (BurstFinalized)")


def burst_wall_vs_legacy(ctx: Context) -> Check | None:
    if ctx.legacy or not ctx.spec or ctx.burst is None or not ctx.burst.scheduler.obs.bursts:
        return None
    value = _sliced_burst_wall(ctx)[0]
    whole = max(b.burst_wall_ms for b in ctx.burst.scheduler.obs.bursts)
    return Check("burst_wall_vs_legacy", value <= whole / 5 + EPS_MS, value, whole / 5,
                 note="at most a fifth of the legacy burst")


def spec_streaming(ctx: Context) -> Check:
    if (skip := ctx.no_spec("spec_streaming")) is not None:
        return skip
    lumps = {r.id: len(set(ctx.run.token_times[r.id])) for r in ctx.spec}
    if ctx.legacy:
        return Check("spec_streaming", max(lumps.values()) == 1, max(lumps.values()), 1,
                     note="legacy: every token visible at once")
    sliced = [r.id for r in ctx.spec if ctx.bursts[r.id].slices > 1]
    fewest = min((lumps[i] for i in sliced), default=0)
    return Check("spec_streaming", bool(sliced) and fewest >= 2, fewest, 2,
                 note="streamed per round (distinct arrival times)")


def rotation(ctx: Context) -> Check:
    """Grants rotate between speculative waiters; the legacy burst runs each job whole (one grant
    each, no waiter parked), so there it must fail."""
    if (skip := ctx.no_spec("rotation")) is not None:
        return skip
    obs = ctx.run.scheduler.obs
    grants = [g for g in obs.grant_log if ":" not in g]
    return Check("rotation", len(grants) >= 3 and obs.waiter_parks >= 1, len(grants), 3,
                 expect=FAIL if ctx.legacy else PASS,
                 note=f"grants; waiter parks (yield-flag quirk) = {obs.waiter_parks}")


def window(ctx: Context) -> Check:
    if not ctx.run.config.enable_batch:
        return Check.skip("window", "B > 1 windows are off: set MLXCEL_ENABLE_MTP_BATCH=1")
    formed = sum(t.kind is TickKind.WINDOW or (t.kind is TickKind.BURST and len(t.request_ids) > 1)
                 for t in ctx.run.ticks)
    return Check("window", formed >= 1, formed, 1, note="a B > 1 speculative window ran")


def aggregate_tok_s(run) -> float | None:
    requests = [{"arrival_ms": r.arrival_ms, "token_times_ms": run.token_times[r.id],
                 "token_ids": r.output_token_ids, "speculative": r.served_speculatively}
                for r in run.requests]
    return metrics.throughput(requests)["aggregate_tok_s"]


def throughput_vs_burst(ctx: Context) -> Check | None:
    """Records the ratio to the legacy burst (trace key `ratio_to_burst`) in every mode; fused mode's
    must be >= min_ratio (0.95), gated in virtual time only (a real clock's is reported)."""
    run, burst = ctx.run, ctx.burst
    if run.config.mode == "burst":
        run.extra["ratio_to_burst"] = 1.0
        return None
    mine, legacy = aggregate_tok_s(run), (aggregate_tok_s(burst) if burst is not None else None)
    ratio = mine / legacy if mine and legacy else None
    run.extra["ratio_to_burst"] = None if ratio is None else round(ratio, 6)
    if run.config.mode != "fused":
        return None
    min_ratio = ctx.wanted.get("throughput_vs_burst", {}).get("min_ratio", DEFAULT_MIN_RATIO)
    if ratio is None:
        return Check.skip("throughput_vs_burst", "no throughput to compare")
    if run.clock_kind != "virtual":  # wall time on a shared CPU is reported, never gated
        return Check.skip("throughput_vs_burst", f"real clock: ratio {ratio:.3f} reported in the table, not gated")
    return Check("throughput_vs_burst", ratio >= min_ratio - EPS_MS, ratio, min_ratio,
                 note=f"aggregate tok/s {mine:.1f} vs legacy burst {legacy:.1f}")


def parity(ctx: Context) -> Check | None:
    if ctx.classic is None:
        return None
    run, classic = ctx.run, ctx.classic
    mismatched = [r.id for r in run.requests
                  if r.output_token_ids != classic.by_id(r.id).output_token_ids
                  or r.finish_reason != classic.by_id(r.id).finish_reason]
    return Check("parity", not mismatched, len(mismatched), 0,
                 note="tokens equal speculation forced off" + (f": {mismatched}" if mismatched else ""))


def kv_released(ctx: Context) -> Check:
    leaked = ctx.run.scheduler.kv.num_in_use + ctx.run.backend.num_live
    return Check("kv_released", leaked == 0, leaked, 0, note="slots and caches freed")


@dataclass(frozen=True)
class Registered:
    fn: Callable[[Context], Check | None]
    asked_by: str | None   # the scenario [checks] key that turns it on; None: every run
    guards: str            # what it guards against (docs/verdicts.md lists these)


CHECKS: dict[str, Registered] = {
    "classic_itl": Registered(classic_itl, "classic_itl", "a classic row waiting on more than its mode's share "
                              "of speculation (the legacy burst must fail it)"),
    "classic_stalled_by_burst": Registered(classic_stalled_by_burst, "classic_itl",
                                           "a burst-mode run that does not show the burst it exists to show"),
    "prefill_stall": Registered(prefill_stall, "prefill_stall", "a long prompt prefilled in one tick while "
                                "classic rows wait (unchunked prefill must fail it)"),
    "prefill_grant": Registered(prefill_grant, "prefill_grant", "a chunked classic prompt beside decode rows "
                                "starved of its grant (more than prefill_grant_interval decode ticks per chunk)"),
    "mixed_step": Registered(mixed_step, "mixed_step", "a mixed step costing more than one chunk and a decode "
                             "step in one forward (a whole prompt beside the decode rows must fail it)"),
    "burst_wall": Registered(burst_wall, "burst_wall", "a speculative request holding the engine for more "
                             "than one round (or its slice 0) per tick"),
    "rounds_per_slice": Registered(rounds_per_slice, "burst_wall", "a tick that runs several rounds, on any "
                                   "clock (counts from BurstFinalized)"),
    "burst_wall_vs_legacy": Registered(burst_wall_vs_legacy, "burst_wall",
                                       "slicing that no longer cuts the legacy burst at least five-fold"),
    "spec_streaming": Registered(spec_streaming, "lump", "a speculative reply delivered in one lump"),
    "rotation": Registered(rotation, "rotation", "speculative waiters starved by the running job "
                           "(the legacy burst must fail it)"),
    "window": Registered(window, "window", "B > 1 windows that never form"),
    "throughput_vs_burst": Registered(throughput_vs_burst, None, "fused mode losing throughput to the legacy burst"),
    "parity": Registered(parity, None, "speculation changing the tokens (against speculation forced off)"),
    "kv_released": Registered(kv_released, None, "KV slots or backend caches left behind"),
}


def evaluate(run, *, classic=None, burst=None) -> list[Check]:
    """Every registered check the scenario asks for (and those every run gets), in CHECKS' order."""
    ctx = Context.of(run, classic, burst)
    asked = [r for r in CHECKS.values() if r.asked_by is None or r.asked_by in ctx.wanted]
    return [c for r in asked if (c := r.fn(ctx)) is not None]


SERVER_AGNOSTIC = ("kv_released",)  # checks that hold for any server's scheduler, not only coopsched's


def evaluate_other_server(run, kind: str) -> list[Check]:
    """A twin of another server kind: its KV books are checked, coopsched's bounds are skipped."""
    ctx = Context.of(run)
    why = f"the twin of a {kind} server: coopsched's bounds do not apply"
    asked = [(name, r) for name, r in CHECKS.items() if r.asked_by is None or r.asked_by in ctx.wanted]
    checks = [r.fn(ctx) if name in SERVER_AGNOSTIC else Check.skip(name, why) for name, r in asked]
    return [c for c in checks if c is not None]
