"""Does the twin predict the server? A small fixed workload, simulated on the calibrated profile in
virtual time and measured on the real thing (the MLX backend in process, or a server over HTTP).

Every figure is pooled over several runs (and as many simulation seeds): throughput is the mean of
the runs', percentiles and means are over the pooled samples. ITL means are given per kind beside
the medians: classic gaps are bimodal under speculation (a plain decode step, or a step plus a
round), so a p50 can flip between the two clusters on a small shift while the mean moves smoothly.
error = predicted / measured - 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import pairwise

import numpy as np

from coopsched.core import MODES, SchedulerConfig
from harness.run import metrics, runner
from harness.run.scenario import RequestSpec, Scenario
from mocks import CostModel

# A classic pair decoding when a speculative request arrives; a third classic row and a second
# speculative request (which waits for the first, or is served classically) join later.
TWIN = Scenario("twin-check", description="calibrate --report: the workload twin and server both run", requests=(
    RequestSpec("c0", arrival_ms=0.0, prompt_len=16, max_tokens=96, speculative=False),
    RequestSpec("c1", arrival_ms=10.0, prompt_len=24, max_tokens=96, speculative=False),
    RequestSpec("s0", arrival_ms=30.0, prompt_len=32, max_tokens=64),
    RequestSpec("c2", arrival_ms=60.0, prompt_len=16, max_tokens=64, speculative=False),
    RequestSpec("s1", arrival_ms=90.0, prompt_len=32, max_tokens=64),
))
METRICS = ("aggregate_tok_s", "spec_tok_s", "classic_itl_p50_ms", "classic_itl_p99_ms", "classic_itl_mean_ms",
           "spec_itl_mean_ms", "ttft_p95_ms", "ttft_mean_ms")
RATES = ("aggregate_tok_s", "spec_tok_s")

Served = list[dict]  # one run: per request {arrival_ms, token_times_ms, num_tokens, speculative}


def served(arrival_ms: float, token_times_ms: Sequence[float], speculative: bool) -> dict:
    return {"arrival_ms": float(arrival_ms), "token_times_ms": [float(t) for t in token_times_ms],
            "num_tokens": len(token_times_ms), "speculative": bool(speculative)}


def pooled(runs: Sequence[Served]) -> dict[str, float | None]:
    """The figures of METRICS over several runs of the workload."""
    rates: dict[str, list[float]] = {k: [] for k in RATES}
    classic: list[float] = []
    spec: list[float] = []
    ttft: list[float] = []
    for run in runs:
        rows = [{**r, "token_ids": [0] * r["num_tokens"]} for r in run]
        for key, value in metrics.throughput(rows).items():
            if value is not None:
                rates[key].append(value)
        for r in run:
            gaps = [b - a for a, b in pairwise(r["token_times_ms"])]
            (spec if r["speculative"] else classic).extend(gaps)
            if r["token_times_ms"]:
                ttft.append(r["token_times_ms"][0] - r["arrival_ms"])
    pick = lambda xs, f: float(f(np.asarray(xs, dtype=float))) if xs else None
    return {
        "aggregate_tok_s": pick(rates["aggregate_tok_s"], np.mean),
        "spec_tok_s": pick(rates["spec_tok_s"], np.mean),
        "classic_itl_p50_ms": pick(classic, lambda a: np.percentile(a, 50)),
        "classic_itl_p99_ms": pick(classic, lambda a: np.percentile(a, 99)),
        "classic_itl_mean_ms": pick(classic, np.mean),
        "spec_itl_mean_ms": pick(spec, np.mean),
        "ttft_p95_ms": pick(ttft, lambda a: np.percentile(a, 95)),
        "ttft_mean_ms": pick(ttft, np.mean),
    }


def classic(scenario: Scenario) -> Scenario:
    """The workload with every request classic: how a server that never speculates serves it."""
    return replace(scenario, requests=tuple(replace(r, speculative=False) for r in scenario.requests))


def compare(predicted: dict, measured: dict) -> dict:
    """{metric: {"predicted", "measured", "error"}}, error = predicted / measured - 1."""
    out = {}
    for metric in METRICS:
        p, m = predicted.get(metric), measured.get(metric)
        error = round(p / m - 1, 4) if p is not None and m else None
        out[metric] = {"predicted": None if p is None else round(p, 4),
                       "measured": None if m is None else round(m, 4), "error": error}
    return out


def twin_config(mode: str, block_size: int = 4, **overrides) -> SchedulerConfig:
    return SchedulerConfig(mode=mode, block_size=block_size, **overrides)


def simulate(profile: CostModel | runner.Profile, config: SchedulerConfig, seeds: Sequence[int],
             scenario: Scenario = TWIN) -> list[Served]:
    """The workload on the profile's twin in virtual time (its mock's costs, its server kind's
    scheduler), once per seed (acceptance and jitter draws)."""
    runs = []
    scenario = runner.priced(scenario, profile)
    for seed in seeds:
        run = runner.execute(scenario, config, seed)
        runs.append(_served_of(run))
    return runs


def simulate_timed(profile: CostModel | runner.Profile, config: SchedulerConfig, scenario: Scenario,
                   seed: int, on_run: Callable[[runner.Run], None] | None = None, draw: int = 0) -> list:
    """One run of a workload scenario on the profile's twin in virtual time, as a sweep point reads it
    (`on_run` gets the whole run: its ticks and counters; `draw`: runner.execute's)."""
    from harness.sweep.points import Timed

    run = runner.execute(runner.priced(scenario, profile), config, seed, draw=draw)
    if on_run:
        on_run(run)
    return [Timed(r.id, r.arrival_ms, run.token_times[r.id], r.served_speculatively) for r in run.requests]


def timed_of(specs: Sequence[RequestSpec], rows: Served) -> list:
    """A live run's rows (measure_workload's, in spec order) as a sweep point reads them."""
    from harness.sweep.points import Timed

    return [Timed(s.id, r["arrival_ms"], r["token_times_ms"], r["speculative"]) for s, r in zip(specs, rows)]


def measure_in_process(make_backend: Callable[[], object], config: SchedulerConfig, seed: int,
                       scenario: Scenario = TWIN) -> Served:
    """One run of the workload on a real backend, in real time (the engine's clock)."""
    from coopsched.clock import RealClock

    run = runner.execute(scenario, config, seed, backend_factory=lambda c, s, sd: make_backend(), clock=RealClock())
    return _served_of(run)


def _served_of(run) -> Served:
    return [served(r.arrival_ms, run.token_times[r.id], r.served_speculatively) for r in run.requests]


def build_report(measured: dict[str, list[Served]], predicted: dict[str, list[Served]], runs: int,
                 meta: dict | None = None) -> dict:
    """{"modes": {mode: compare(...)}, "ratio_to_burst": {mode: {"predicted", "measured"}}, ...}."""
    modes = {mode: compare(pooled(predicted[mode]), pooled(measured[mode])) for mode in measured}
    ratios = {}
    if "burst" in modes:  # every mode's aggregate throughput over the burst's, both ways
        burst = modes["burst"]["aggregate_tok_s"]
        for mode, rows in modes.items():
            ratios[mode] = {k: (round(rows["aggregate_tok_s"][k] / burst[k], 4)
                                if rows["aggregate_tok_s"][k] and burst[k] else None)
                            for k in ("predicted", "measured")}
    return {"workload": [r.id for r in TWIN.requests], "runs": runs, **(meta or {}), "modes": modes,
            "ratio_to_burst": ratios}


def all_modes() -> tuple[str, ...]:
    return tuple(MODES)


def print_report(console, report: dict, title: str) -> None:
    from rich.table import Table

    table = Table(title=title, box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    for col in ("mode", "metric", "predicted", "measured", "error"):
        table.add_column(col, justify="left" if col in ("mode", "metric") else "right", no_wrap=True)
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    for mode, rows in report["modes"].items():
        for metric, row in rows.items():
            error = "-" if row["error"] is None else f"{row['error']:+.1%}"
            table.add_row(mode, metric, fmt(row["predicted"]), fmt(row["measured"]), error)
    console.print(table)
    for mode, ratio in report.get("ratio_to_burst", {}).items():
        if mode != "burst":
            console.print(f"  {mode} x burst aggregate tok/s: predicted {fmt(ratio['predicted'])}, "
                          f"measured {fmt(ratio['measured'])}", highlight=False)
