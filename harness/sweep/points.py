"""Sweep points: (mode, load, seed) -> the scenario's workload at that load, run once, reduced to figures.

`plan` builds picklable tasks (the scenario at its load, the scheduler config, the seed, the
SLO) in the calling process, so a worker (a forked process, a Dask worker) runs a point
without reading the environment; `run_point` runs one in virtual time; `figures` reduces
per-request token times to the point's keys under the per-token SLO (harness/run/slo.py);
`capacity` applies the rule of the sweep JSON's `capacity`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from coopsched.core import FinishReason, SchedulerConfig
from harness.run import metrics, runner
from harness.run.scenario import Scenario
from harness.run.slo import RequestTiming, Slo, violations

LOAD_KINDS = ("rate", "concurrency")
MISS_CAUSES = ("ttft", "itl", "failed")
# figures averaged over seeds in the summary (and drawn by the sweep page)
MEANS = ("slo_attainment", "goodput_rps", "classic_itl_p50_ms", "classic_itl_p99_ms", "classic_itl_max_ms",
         "itl_p99_ms", "ttft_p50_ms", "ttft_p95_ms", "aggregate_tok_s", "spec_tok_s")
EPS = 1e-9  # a mean of per-seed shares compared with a fraction: float noise is not a miss


class SweepError(ValueError):
    """A sweep that cannot run; the message names the value and what is accepted."""


@dataclass(frozen=True)
class Task:
    """One point to run: everything a worker needs, nothing read from its environment."""
    index: int
    mode: str
    load: int | float
    seed: int
    scenario: Scenario             # already at this load
    config: SchedulerConfig | None  # None: a live server decides
    slo: Slo


@dataclass(frozen=True, slots=True)
class Timed:
    """One request as a point reduces it: when it was sent, each token's time (ms), and whether it
    was served speculatively (the rest are "classic")."""
    id: str
    arrival_ms: float
    token_times_ms: Sequence[float]
    speculative: bool
    error: str | None = None


def check_sweepable(scen: Scenario, kind: str) -> None:
    workload = scen.workload
    if workload is None:
        raise SweepError(f"scenario {scen.name!r} has no [workload], so it cannot be swept: a sweep sets the "
                         "workload's rate_per_s (--rates) or concurrency (--concurrency); add a [workload] table")
    if kind == "rate" and workload.is_closed:
        raise SweepError(f"--rates: scenario {scen.name!r} is a closed loop (arrival = \"closed\") and --rates "
                         "sets an open loop's rate_per_s; use --concurrency, or an open-loop arrival "
                         "(poisson, gamma, constant)")


def at_load(scen: Scenario, kind: str, load: int | float) -> Scenario:
    """The scenario with its workload at this load: an open loop at `load` requests/s (a replayed
    trace: `load` times as fast, its speedup), or a closed loop of `load` users (an open-loop
    workload or a trace becomes closed; its other draws, or the trace's lengths, are kept)."""
    workload = scen.workload
    assert workload is not None
    if kind == "rate" and workload.trace:
        return replace(scen, workload=replace(workload, speedup=float(load)))
    if kind == "rate":
        return replace(scen, workload=replace(workload, rate_per_s=float(load)))
    return replace(scen, workload=replace(workload, arrival="closed", concurrency=int(load), rate_per_s=None,
                                          burstiness=1.0))


def plan(scen: Scenario, kind: str, loads: Sequence[int | float], modes: Sequence[str], seeds: int, slo: Slo,
         configs: dict[str, SchedulerConfig | None] | None = None) -> list[Task]:
    """Modes x loads x seeds (seeds 0..N-1), in that order; configs default to the gates + --mode."""
    check_sweepable(scen, kind)
    if configs is None:
        configs = {mode: runner.scenario_config(scen, mode) for mode in modes}
    loaded = {load: at_load(scen, kind, load) for load in loads}
    return [Task(i, mode, load, seed, loaded[load], configs[mode], slo)
            for i, (mode, load, seed) in enumerate((m, lo, s) for m in modes for lo in loads for s in range(seeds))]


def run_point(task: Task) -> dict:
    """One point in virtual time on the scenario's mock: a single run, no reference runs."""
    assert task.config is not None
    run = runner.execute(task.scenario, task.config, task.seed)
    timed = [Timed(r.id, r.arrival_ms, run.token_times[r.id], r.served_speculatively,
                   (r.error or "error") if r.finish_reason is FinishReason.ERROR else None)
             for r in run.requests]
    return point(task, timed)


def point(task: Task, timed: Sequence[Timed], **extra) -> dict:
    return {"mode": task.mode, "load": task.load, "seed": task.seed, **figures(timed, task.slo), **extra}


def _round(value):
    return round(value, 6) if isinstance(value, float) else value


def figures(timed: Sequence[Timed], slo: Slo) -> dict:
    """The point's keys from per-token times: pooled per-token gaps (classic = not served
    speculatively), TTFT, throughput over the run's span (first arrival -> last token), and the
    SLO over every request: `goodput_rps` = requests that met it per second of that span."""
    timings = [RequestTiming(t.id, t.token_times_ms[0] - t.arrival_ms if len(t.token_times_ms) else None,
                             tuple(metrics.itl(t.token_times_ms)), t.error) for t in timed]
    causes = [violations(slo, r) for r in timings]
    met = sum(not c for c in causes)
    classic = metrics.percentiles([g for t, r in zip(timed, timings) if not t.speculative for g in r.gaps_ms])
    ttft = metrics.percentiles([r.ttft_ms for r in timings if r.ttft_ms is not None], (50, 95))
    rows = [{"arrival_ms": t.arrival_ms, "token_times_ms": t.token_times_ms, "token_ids": t.token_times_ms,
             "speculative": t.speculative} for t in timed]
    throughput = metrics.throughput(rows)
    ends = [t.token_times_ms[-1] for t in timed if len(t.token_times_ms)]
    span_ms = max(ends) - min(t.arrival_ms for t in timed) if ends else 0.0
    out = {
        "requests": len(timed),
        "classic_itl_p50_ms": classic["p50"], "classic_itl_p99_ms": classic["p99"],
        "classic_itl_max_ms": classic["max"],
        "itl_p99_ms": metrics.percentiles([g for r in timings for g in r.gaps_ms], (99,))["p99"],
        "ttft_p50_ms": ttft["p50"], "ttft_p95_ms": ttft["p95"],
        "aggregate_tok_s": throughput["aggregate_tok_s"], "spec_tok_s": throughput["spec_tok_s"],
        "goodput_rps": 1000.0 * met / span_ms if span_ms > 0 else None,
        "slo_attainment": met / len(timed) if timed else None,
        "met": met,
        "slo_misses": {cause: sum(cause in c for c in causes) for cause in MISS_CAUSES},
        "span_s": span_ms / 1000.0,
        # what each percentile was computed over (coopsched compare's sample-size rule)
        "samples": {"classic_gaps": sum(len(r.gaps_ms) for t, r in zip(timed, timings) if not t.speculative),
                    "ttft": sum(r.ttft_ms is not None for r in timings)},
    }
    return {k: _round(v) for k, v in out.items()}


# -- over seeds -------------------------------------------------------------------------------
def _by_mode_load(points: Sequence[dict]) -> dict[str, dict]:
    groups: dict[str, dict] = {}
    for p in points:
        groups.setdefault(p["mode"], {}).setdefault(p["load"], []).append(p)
    return groups


def mean_attainment(points: Sequence[dict]) -> dict[str, dict]:
    """{mode: {load: mean attainment over its seeds}} (a point with no attainment counts 0)."""
    return {mode: {load: math.fsum(p["slo_attainment"] or 0.0 for p in group) / len(group)
                   for load, group in by_load.items()}
            for mode, by_load in _by_mode_load(points).items()}


def capacity(points: Sequence[dict], threshold: float) -> dict[str, int | float | None]:
    """Per mode: the highest swept load such that it and every lower swept load have a mean
    attainment over seeds >= threshold; None when the lowest load already misses it."""
    out: dict[str, int | float | None] = {}
    for mode, by_load in mean_attainment(points).items():
        best = None
        for load in sorted(by_load):
            if by_load[load] < threshold - EPS:
                break
            best = load
        out[mode] = best
    return out


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return _round(math.fsum(values) / len(values)) if values else None


def summary(points: Sequence[dict]) -> dict[str, list[dict]]:
    """Per mode, one row per load: each figure's mean over seeds, the lowest seed's attainment,
    and (with --target) the mean of each /metrics delta."""
    out = {}
    for mode, by_load in _by_mode_load(points).items():
        rows = []
        for load in sorted(by_load):
            group = by_load[load]
            row = {"load": load, "seeds": len(group), **{key: _mean(p[key] for p in group) for key in MEANS},
                   "slo_attainment_min": min(p["slo_attainment"] or 0.0 for p in group)}
            deltas = [p["metrics_delta"] for p in group if p.get("metrics_delta") is not None]
            if deltas:
                row["metrics_delta"] = {name: _mean(d.get(name) for d in deltas)
                                        for name in sorted({n for d in deltas for n in d})}
            rows.append(row)
        out[mode] = rows
    return out
