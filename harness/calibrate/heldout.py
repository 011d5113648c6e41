"""`calibrate --report`'s held-out check: open-loop Poisson workloads unlike the calibration's, half
the requests speculative, one light and one near the server's knee (found by a short live ladder of
doubling rates), each run LIVE_RUNS times live and once on the twin. Per metric: predicted, measured
(the mean of the live runs), error = predicted / measured - 1, and the live runs' own spread
((max - min) / mean); a row passes when |error| <= max(its tolerance, SPREAD_FACTOR x spread).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from harness.run import metrics
from harness.run.scenario import Scenario
from harness.run.slo import Slo
from harness.run.workload import Lengths, Workload
from harness.sweep.points import Timed, figures

# the figures a twin is judged on, each with its tolerance (a fraction of the measured value)
TOLERANCE = {"aggregate_tok_s": 0.10, "ttft_p50_ms": 0.20, "ttft_p95_ms": 0.25, "itl_mean_ms": 0.10,
             "classic_itl_p99_ms": 0.20}
METRICS = tuple(TOLERANCE)
SPREAD_FACTOR = 1.5
LIVE_RUNS = 3
NUM_REQUESTS = 32
SEED = 23            # arrivals and lengths: a draw the calibration never makes
LIGHT_IN_FLIGHT = 0.5  # the light workload: this many requests in flight on average, by the solo life
LADDER_RUNGS = 5       # doublings of the light rate tried, at most, to find the knee
KEEP_UP = 0.8          # a rung keeps up when its tokens/s per offered request/s stay >= this x the light's
TTFT_RISE = 3.0        # ... and its TTFT p50 stays under this x the light's (a queue has not formed)
RULE = (f"|error| <= max(tolerance, {SPREAD_FACTOR:g} x spread); spread = (max - min) / mean of the "
        f"{LIVE_RUNS} live runs; tolerances: " + ", ".join(f"{m} {t:.0%}" for m, t in TOLERANCE.items()))
NO_SLO = Slo(itl_ms=1e12, ttft_ms=1e12)  # figures() wants one; the check reads no attainment

Run = Callable[[Scenario, int], list[Timed]]  # (scenario at a rate, run index) -> the requests as served


def workload(rate_per_s: float, num_requests: int = NUM_REQUESTS) -> Scenario:
    """The held-out workload at a rate: prompts of 24-192 tokens and lognormal budgets around 48 (the
    calibration sends lone fixed lengths and fixed batches), Poisson arrivals, half speculative."""
    load = Workload("poisson", num_requests, rate_per_s=float(rate_per_s),
                    prompt_len=Lengths(low=24, high=192), max_tokens=Lengths(mean=48.0, sigma=0.4),
                    speculative_share=0.5)
    return Scenario("heldout", description="calibrate --report: held-out open-loop workload", workload=load)


def solo_life_ms(cost) -> float:
    """A mean request of the workload (108 prompt tokens, 48 tokens out), alone, on these costs."""
    return float(cost.prefill(108) + 48 * cost.decode(1))


def light_rate(solo_life_ms: float) -> float:
    """LIGHT_IN_FLIGHT requests in flight on average, when each lives solo_life_ms."""
    return round(LIGHT_IN_FLIGHT * 1000.0 / max(solo_life_ms, 1.0), 3)


def run_figures(timed: Sequence[Timed]) -> dict[str, float | None]:
    """The METRICS of one run: the sweep point's figures and the mean of every inter-token gap."""
    failed = [t for t in timed if t.error]
    if failed:
        raise RuntimeError(f"held-out run: {len(failed)} of {len(timed)} requests failed, first: {failed[0].error}")
    point = figures(timed, NO_SLO)
    gaps = [g for t in timed for g in metrics.itl(t.token_times_ms)]
    point["itl_mean_ms"] = float(np.mean(gaps)) if gaps else None
    return {m: point[m] for m in METRICS}


def row(metric: str, predicted: float | None, runs: Sequence[float | None]) -> dict:
    """One metric's line: the pass rule applied (pass None when a side has no value)."""
    values = [v for v in runs if v is not None]
    measured = float(np.mean(values)) if len(values) == len(runs) and values else None
    spread = (max(values) - min(values)) / measured if measured else None
    error = predicted / measured - 1 if predicted is not None and measured else None
    allowed = max(TOLERANCE[metric], SPREAD_FACTOR * spread) if spread is not None else None
    r4 = lambda v: None if v is None else round(v, 4)
    return {"predicted": r4(predicted), "measured": r4(measured), "error": r4(error), "spread": r4(spread),
            "tolerance": TOLERANCE[metric], "allowed": r4(allowed),
            "pass": None if error is None or allowed is None else bool(abs(error) <= allowed + 1e-12),
            "runs": [r4(v) for v in runs]}


def compare(predicted: dict, live: Sequence[dict]) -> dict:
    """{metric: row} and the verdict: every judged row passes (a row with no value is not judged)."""
    rows = {m: row(m, predicted[m], [run[m] for run in live]) for m in METRICS}
    judged = [r["pass"] for r in rows.values() if r["pass"] is not None]
    return {"rows": rows, "pass": bool(judged) and all(judged)}


@dataclass(frozen=True)
class Rung:
    rate_per_s: float
    figures: dict
    keeps_up: bool

    def to_json(self) -> dict:
        return {"rate_per_s": self.rate_per_s, "keeps_up": self.keeps_up,
                **{k: None if v is None else round(v, 4) for k, v in self.figures.items()}}


def ladder(live: Run, light: float, num_requests: int, rungs: int = LADDER_RUNGS) -> tuple[float, list[Rung]]:
    """Doubling rates from the light one, each run once live, until one no longer keeps up (see
    KEEP_UP, TTFT_RISE): the knee is the last doubling that kept up, else the first doubling."""
    base = run_figures(live(workload(light, num_requests), 0))
    out = [Rung(light, base, True)]
    per_request = (base["aggregate_tok_s"] or 0.0) / light
    for i in range(1, rungs + 1):
        rate = round(light * 2 ** i, 3)
        got = run_figures(live(workload(rate, num_requests), 0))
        keeps = ((got["aggregate_tok_s"] or 0.0) / rate >= KEEP_UP * per_request
                 and (got["ttft_p50_ms"] or 0.0) <= TTFT_RISE * max(base["ttft_p50_ms"] or 0.0, 1.0))
        out.append(Rung(rate, got, keeps))
        if not keeps:
            break
    kept = [r.rate_per_s for r in out if r.keeps_up]
    return (kept[-1] if len(kept) > 1 else out[min(1, len(out) - 1)].rate_per_s), out


def check(live: Run, twin: Callable[[Scenario], list[Timed]], solo_life_ms: float,
          num_requests: int = NUM_REQUESTS, runs: int = LIVE_RUNS, progress: Callable[[str], None] | None = None
          ) -> dict:
    """The held-out report: the ladder, then the light and knee workloads live `runs` times and once
    on the twin, compared row by row."""
    say = progress or (lambda _: None)
    light = light_rate(solo_life_ms)
    say(f"knee ladder from {light:g} req/s")
    knee, rungs = ladder(live, light, num_requests)
    out: dict = {"rule": RULE, "requests": num_requests, "seed": SEED, "live_runs": runs,
                 "ladder": [r.to_json() for r in rungs], "knee_rate_per_s": knee, "workloads": {}}
    for name, rate in (("light", light), ("knee", knee)):
        scen = workload(rate, num_requests)
        live_figures = []
        for i in range(runs):
            say(f"{name} workload ({rate:g} req/s) live run {i + 1}/{runs}")
            live_figures.append(run_figures(live(scen, i)))
        predicted = run_figures(twin(scen))
        out["workloads"][name] = {"rate_per_s": rate, **compare(predicted, live_figures)}
    out["pass"] = all(w["pass"] for w in out["workloads"].values())
    return out


def print_check(console, report: dict, title: str) -> None:
    from rich.table import Table

    table = Table(title=title, box=None, pad_edge=False, padding=(0, 1), header_style="bold",
                  caption=f"rule: {report['rule']}")
    for col in ("workload", "metric", "predicted", "measured", "error", "spread", "allowed", "verdict"):
        table.add_column(col, justify="left" if col in ("workload", "metric") else "right", no_wrap=True)
    num = lambda v: "-" if v is None else f"{v:.2f}"
    pct = lambda v: "-" if v is None else f"{v:+.1%}"
    for name, w in report["workloads"].items():
        for metric, r in w["rows"].items():
            verdict = "-" if r["pass"] is None else ("[green]PASS[/]" if r["pass"] else "[red]FAIL[/]")
            table.add_row(f"{name} {w['rate_per_s']:g}/s", metric, num(r["predicted"]), num(r["measured"]),
                          pct(r["error"]), "-" if r["spread"] is None else f"{r['spread']:.1%}",
                          "-" if r["allowed"] is None else f"{r['allowed']:.0%}", verdict)
        table.add_section()
    console.print(table)
    ladder_text = ", ".join(f"{r['rate_per_s']:g}/s {'ok' if r['keeps_up'] else 'saturated'}"
                            for r in report["ladder"])
    rows = [r for w in report["workloads"].values() for r in w["rows"].values() if r["pass"] is not None]
    wide = sum(r["allowed"] > r["tolerance"] for r in rows)
    console.print(f"knee ladder: {ladder_text} -> knee {report['knee_rate_per_s']:g} req/s; held-out check "
                  f"{'[green]PASS[/]' if report['pass'] else '[red]FAIL[/]'}; {wide} of {len(rows)} rows allowed "
                  "more than their tolerance by the live runs' own spread (a loaded machine widens it)",
                  highlight=False, soft_wrap=True)
