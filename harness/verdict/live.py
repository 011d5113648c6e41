"""The checks of live runs (locust, --target) and of `coopsched judge`, registered by name.

Thin adapters over the live rules: the stall rule (harness/live/stalls.py: is a wait over its limit
the server's fault?), the solo multiple (harness/live/solo.py) and the SLO (harness/run/slo.py).
`locust_verdict` judges the concurrency2 locust samples (harness/live/samples.py) with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from harness.live import solo, stalls
from harness.live.samples import KINDS, PROMPTS
from harness.verdict.check import Check, Tally
from harness.verdict.slo import slo_check

REAL_TIME_ALLOWANCE = 1.5
DEFAULT_BLOCK_SIZE = 4  # K when /health does not say: one round streams at most K tokens


def stall_check(name: str, waits: list[stalls.Wait], streams: Sequence[stalls.Stream], rule: stalls.Rule,
                limit: str) -> Check:
    """A time check whose waits over their limit fail it only when the stall rule charges them
    (`stalls` in the record: the rule's summary)."""
    line = stalls.judge(waits, streams, rule)
    summary = stalls.summarize(waits, line, rule)
    worst = max(waits, key=lambda w: w.ms - w.limit_ms)
    shown = max([w for w in waits if w.verdict == "hol"] or [worst], key=lambda w: w.ms - w.limit_ms)
    return Check(name, summary.num_hol == 0, shown.ms, shown.limit_ms,
                 note=f"worst: {shown.stream.id} (token {shown.index}, {shown.evidence} tokens of {shown.by} "
                      f"{'in one lump ahead of its pace' if shown.measure == 'lump' else 'in it'}, allowed "
                      f"{shown.allowance}); {summary.num_over} of {summary.num_waits} over the limit: "
                      f"{summary.num_hol} head-of-line, {summary.num_noise} noise; {limit}; {summary.rule}",
                 extra={"stalls": summary.to_json()})


def failures_check(failures: int) -> Check:
    return Check("failures", failures == 0, failures, 0, note="every request streamed without an error")


def p99_check(charged_p99_ms: float, limit_ms: float) -> Check:
    return Check("classic_itl_p99", charged_p99_ms <= limit_ms, charged_p99_ms, limit_ms,
                 note="classic ITL p99, noise counted at its limit")


def solo_runs_check(broken: list[str]) -> Check:
    return Check("solo_runs", not broken, len(broken), 0,
                 note=f"the solo run of {', '.join(broken)} streamed no token" if broken else "every solo run streamed")


# -- the concurrency2 locust run -------------------------------------------------------------
def locust_verdict(data: dict, costs: dict | None, *, bound_ms: float | None = None, slice0_ms: float | None = None,
                   solo_figures: dict | None = None, block_size: int | None = None) -> dict:
    """The locust report of Samples.data: percentiles, then checks; `ok` is True only when every check
    held, None when one was skipped (a kind without samples) and none failed."""
    ms = {kind: {"ttft": np.asarray(data[kind]["ttft_ns"], dtype=np.int64) / 1e6,
                 "gaps": np.asarray(data[kind]["gaps_ns"], dtype=np.int64) / 1e6} for kind in KINDS}
    report = percentiles(data, ms)
    missing = [k for k in KINDS if not ms[k]["gaps"].size]
    if missing:
        why = f"no token gaps of {' and '.join(missing)}: nothing to judge (neither pass nor fail)"
        report.update(missing=missing, calibration=None, rule=why)
        return with_checks(report, [Check.skip("classic_itl", why), failures_check(report["failures"])])
    streams = [stalls.Stream.from_json(d) for d in data["streams"]]
    if costs is None and (bound_ms is None or slice0_ms is None):
        return solo_verdict(report, ms, solo_figures or {}, streams, block_size)
    if costs:
        prompt = max(data["spec"]["prompt_tokens"], default=len(PROMPTS["spec"].encode()))
        bound_ms = bound_ms if bound_ms is not None else costs["decode_ms"] + costs["round_ms"]
        slice0_ms = slice0_ms if slice0_ms is not None else (costs["slice0_fixed_ms"]
                                                             + costs["slice0_per_token_ms"] * prompt)
    return bound_verdict(report, streams, bound_ms, slice0_ms, "costs" if costs else "bound-ms", block_size)


def percentiles(data: dict, ms: dict) -> dict:
    pct = lambda a, q: float(np.percentile(a, q)) if a.size else None
    classic = ms["classic"]["gaps"]
    return {
        "bound_ms": None, "slice0_ms": None,
        "classic_itl_p50_ms": pct(classic, 50), "classic_itl_p99_ms": pct(classic, 99),
        "classic_itl_max_ms": float(classic.max()) if classic.size else None,
        "classic_ttft_p50_ms": pct(ms["classic"]["ttft"], 50),
        "spec_ttft_p50_ms": pct(ms["spec"]["ttft"], 50), "spec_ttft_p95_ms": pct(ms["spec"]["ttft"], 95),
        "spec_itl_p50_ms": pct(ms["spec"]["gaps"], 50), "spec_itl_p99_ms": pct(ms["spec"]["gaps"], 99),
        "samples": {k: int(ms[k]["gaps"].size) for k in KINDS},
        "requests": {k: data[k]["requests"] for k in KINDS},
        "events": {k: data[k]["events"] for k in KINDS},
        "tokens": {k: data[k]["tokens"] for k in KINDS},
        "failures": sum(data[k]["failures"] for k in KINDS),
    }


def with_checks(report: dict, checks: list[Check]) -> dict:
    """The checks into the report, and `ok` from them (a skip is never a pass)."""
    tally = Tally.of((c.name, c) for c in checks)
    report["checks"] = [c.to_json() for c in checks]
    report["ok"] = False if tally.failed else (None if tally.skipped else True)
    return report


def with_locust_failures(report: dict, num_failures: int, data: dict) -> dict:
    """Locust's own failure count as one more check: a failed request fails the run, whatever the samples say."""
    report["locust_failures"] = num_failures
    if num_failures and report.get("missing"):
        first = next((r["error"] for r in data["per_request"] if r.get("error")), "see locust's stats")
        report["rule"] = f"{num_failures} request(s) failed (the first: {first}); no verdict on latency"
    failed = Check("locust_failures", num_failures == 0, num_failures, 0, note="requests locust counted as failed")
    return with_checks(report, [*map(Check.from_json, report["checks"]), failed])


def bound_verdict(report: dict, streams: list, bound: float, slice0: float, calibration: str,
                  block_size: int | None) -> dict:
    """Bounds from the server's costs (or --bound-ms/--slice0-ms): classic ITL p99 <= 1.5 b + 5 and every
    classic gap <= 1.5 (b + slice 0) + 10 ms, a gap over its limit charged only if a stream ran ahead."""
    p99_limit = REAL_TIME_ALLOWANCE * bound + 5.0
    gap_limit = REAL_TIME_ALLOWANCE * (bound + slice0) + 10.0
    rule = stalls.Rule(tokens_per_round=block_size or DEFAULT_BLOCK_SIZE)
    classic = [st for st in streams if st.kind == "classic"]
    every = [w for st in classic for w in stalls.waits_of(st, gap_limit)]
    text = (f"classic ITL p99 <= 1.5 x {bound:.1f} + 5 = {p99_limit:.1f} ms and every classic gap <= "
            f"1.5 x ({bound:.1f} + {slice0:.1f}) + 10 = {gap_limit:.1f} ms")
    gaps = stall_check("classic_itl", every, streams, rule, text)
    tail = [w for st in classic for w in stalls.waits_of(st, p99_limit)]
    tail_summary = stall_check("classic_itl_p99", tail, streams, rule, text).extra["stalls"]
    charged_p99 = stalls.charged_percentile(tail, 99)
    summary = gaps.extra["stalls"]
    report.update(
        bound_ms=bound, slice0_ms=slice0, calibration=calibration, p99_limit_ms=p99_limit, gap_limit_ms=gap_limit,
        classic_itl_p99_charged_ms=charged_p99,
        classic_itl_max_charged_ms=max((w.charged_ms for w in every), default=0.0),
        margin=summary["worst_over_limit"], stalls={"every_gap": summary, "p99": tail_summary},
        rule=f"{text}, where {summary['rule']}")
    return with_checks(report, [p99_check(charged_p99, p99_limit), gaps, failures_check(report["failures"])])


def solo_verdict(report: dict, ms: dict, figures: dict, streams: list, block_size: int | None = None) -> dict:
    """No costs: every request's TTFT and every gap of a kind within the solo rule of its kind, a wait
    over it charged to the server only if a stream ran ahead in it (R: the server's block size when
    /health gives it, else the most tokens one event carried alone)."""
    report.update(calibration="solo", solo={k: f.to_json() for k, f in figures.items()})
    broken = [k for k in KINDS if k not in figures or figures[k].ttft_ms is None]
    if broken:
        runs = solo_runs_check(broken)
        report["rule"] = runs.note
        return with_checks(report, [runs])
    # each gap limit is capped at half the other kind's solo run: a longer one could hide a burst
    ceiling = {k: solo.ceiling_ms(figures[o].life_ms for o in KINDS if o != k) for k in KINDS}
    limits = {k: {"ttft_limit_ms": solo.solo_limit(figures[k].ttft_ms),
                  "gap_limit_ms": solo.solo_limit(figures[k].stall_ms, ceiling[k])} for k in KINDS}
    worst = {k: {"ttft_max_ms": float(ms[k]["ttft"].max()) if ms[k]["ttft"].size else None,
                 "gap_max_ms": float(ms[k]["gaps"].max())} for k in KINDS}
    rule = stalls.Rule(tokens_per_round=block_size or max(figures[k].max_tokens_per_event for k in KINDS),
                       pace_ms=min((figures[k].pace_ms for k in KINDS if figures[k].pace_ms), default=None),
                       paces=tuple((k, figures[k].pace_ms) for k in KINDS if figures[k].pace_ms))
    waits = [w for st in streams
             for w in stalls.waits_of(st, limits[st.kind]["gap_limit_ms"], limits[st.kind]["ttft_limit_ms"])]
    text = "; ".join(f"{k}: TTFT max {worst[k]['ttft_max_ms']:.1f} <= {limits[k]['ttft_limit_ms']:.1f}, gap max "
                     f"{worst[k]['gap_max_ms']:.1f} <= {limits[k]['gap_limit_ms']:.1f}" for k in KINDS)
    waits_check = stall_check("waits_vs_solo", waits, streams, rule, f"{solo.RULE} ({text})")
    summary = waits_check.extra["stalls"]
    report.update(solo_limits=limits, gap_limit_ms=limits["classic"]["gap_limit_ms"],
                  margin=summary["worst_over_limit"], stalls={"waits": summary},
                  rule=f"the server reports no costs, each kind ran alone first; {solo.RULE} ({text}), "
                       f"where {summary['rule']}")
    return with_checks(report, [waits_check, failures_check(report["failures"])])


@dataclass(frozen=True)
class Registered:
    fn: Callable[..., Check]
    guards: str


CHECKS: dict[str, Registered] = {
    "classic_itl": Registered(stall_check, "a classic stream held past its limit while another stream ran ahead "
                              "(head-of-line blocking; a gap the whole machine shared is noise)"),
    "classic_itl_p99": Registered(p99_check, "a classic tail above 1.5 b + 5 ms, noise counted at its limit"),
    "waits_vs_solo": Registered(stall_check, "a TTFT or gap beyond the solo multiple of its kind while another "
                                "stream ran ahead (servers that report no costs)"),
    "solo_runs": Registered(solo_runs_check, "a solo run that streamed nothing, so no limit can be built"),
    "failures": Registered(failures_check, "requests that failed or miscounted their tokens"),
    "locust_failures": Registered(with_locust_failures, "requests locust itself counted as failed"),
    "slo_attainment": Registered(slo_check, "fewer requests than the target meeting the per-token SLO"),
}
