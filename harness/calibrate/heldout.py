"""`calibrate --report`'s held-out check: open-loop Poisson workloads unlike the calibration's, half
the requests speculative, one light and one near the server's knee (found by a short live ladder of
doubling rates), each run LIVE_RUNS times live and TWIN_DRAWS times on the twin (the same requests,
its costs and acceptance drawn anew each run). Per metric: predicted (the mean of the twin's runs,
with their own spread beside it), measured (the mean of the live runs), error = predicted / measured
- 1, and the live runs' own spread ((max - min) / mean); a row passes when |error| <= max(its
tolerance, SPREAD_FACTOR x spread).
Classic rows are the requests that asked for no speculation, on both sides (a server that speculates
every request still serves them). Beside it: the capacity under CAPACITY_SLO, searched past the
ladder until the live server misses it (harness/calibrate/search.py), live and on the twin, and
optionally a second twin ("before": the cost-only profile) per row, and the server's step books
beside the twins' (harness/calibrate/books.py) when it keeps them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from harness.calibrate import search
from harness.calibrate.books import books_line, mean_per_key, price_drift
from harness.run import metrics
from harness.run.scenario import Scenario
from harness.run.slo import DEFAULT_ATTAINMENT, Slo, parse_slo
from harness.run.workload import Lengths, Workload
from harness.sweep import points
from harness.sweep.points import Timed, figures

# the figures a twin is judged on, each with its tolerance (a fraction of the measured value)
TOLERANCE = {"aggregate_tok_s": 0.10, "ttft_p50_ms": 0.20, "ttft_p95_ms": 0.25, "itl_mean_ms": 0.10,
             "classic_itl_p99_ms": 0.20}
METRICS = tuple(TOLERANCE)
SPREAD_FACTOR = 1.5
LIVE_RUNS = 3
TWIN_DRAWS = 8  # the twin's prediction is the mean of this many runs, its costs and acceptance drawn anew:
                # one run's TTFT p95 moved 29-58% between draws (llama.cpp with a draft model, 2026-12-07)
NUM_REQUESTS = 32
SEED = 23            # arrivals and lengths: a draw the calibration never makes
LIGHT_IN_FLIGHT = 0.5  # the light workload: this many requests in flight on average, by the solo life
LADDER_RUNGS = 5       # doublings of the light rate tried, at most, to find the knee
REFINE_RUNGS = 2       # midpoints tried between the light rate and a first doubling that fell behind
KEEP_UP = 0.8          # a rung keeps up when its tokens/s per offered request/s stay >= this x the light's
TTFT_RISE = 3.0        # ... and its TTFT p50 stays under this x the light's (a queue has not formed)
RULE = (f"|error| <= max(tolerance, {SPREAD_FACTOR:g} x spread); spread = (max - min) / mean of the "
        f"{LIVE_RUNS} live runs; tolerances: " + ", ".join(f"{m} {t:.0%}" for m, t in TOLERANCE.items()))
CAPACITY_SLO = "itl_ms=250,ttft_ms=2000"  # the capacity's SLO: every gap and the TTFT of a request
DRIFT_NOTE = 0.15  # a failed check whose server's one-row ticks moved more than this from their prices says so

# (scenario at a rate, run index, a capacity rung's way out or None) -> the requests as served
Run = Callable[[Scenario, int, "search.GiveUp | None"], list[Timed]]
Predict = Callable[[Scenario, int], list[Timed]]  # a twin: (scenario, draw) -> the requests as it serves them
Books = Callable[[str], dict | None]  # side ("live", "twin", "before") -> the books of its run just made


def workload(rate_per_s: float, num_requests: int = NUM_REQUESTS) -> Scenario:
    """The held-out workload at a rate: prompts of 24-192 tokens and lognormal budgets around 48 (the
    calibration sends lone fixed lengths and fixed batches), Poisson arrivals, half speculative."""
    load = Workload("poisson", num_requests, rate_per_s=float(rate_per_s),
                    prompt_len=Lengths(low=24, high=192), max_tokens=Lengths(mean=48.0, sigma=0.4),
                    speculative_share=0.5)
    return Scenario("heldout", description="calibrate --report: held-out open-loop workload", workload=load)


def solo_life_ms(cost) -> float:
    """A mean request of the workload (108 prompt tokens, 48 tokens out), alone, on these costs: its
    decode steps read a cache of 108, 109, ... tokens (priced when the profile has a context term)."""
    return float(cost.prefill(108) + 48 * cost.decode(1) + cost.context(48 * 108 + 48 * 47 // 2))


def light_rate(solo_life_ms: float) -> float:
    """LIGHT_IN_FLIGHT requests in flight on average, when each lives solo_life_ms."""
    return round(LIGHT_IN_FLIGHT * 1000.0 / max(solo_life_ms, 1.0), 3)


def by_ask(scen: Scenario, timed: Sequence[Timed]) -> list[Timed]:
    """The run's requests, classic when they asked for no speculation: vLLM with ngram and llama.cpp
    with a draft model speculate every request, and their classic rows are still the workload's."""
    asked = {spec.id: spec.speculative for spec in scen.specs(SEED)}
    return [replace(t, speculative=asked[t.id]) for t in timed]


def run_figures(timed: Sequence[Timed], slo: Slo) -> dict[str, float | None]:
    """The METRICS of one run (the sweep point's figures and the mean of every inter-token gap), and
    its attainment of `slo`."""
    failed = [t for t in timed if t.error]
    if failed:
        raise RuntimeError(f"held-out run: {len(failed)} of {len(timed)} requests failed, first: {failed[0].error}")
    point = figures(timed, slo)
    gaps = [g for t in timed for g in metrics.itl(t.token_times_ms)]
    point["itl_mean_ms"] = float(np.mean(gaps)) if gaps else None
    return {m: point[m] for m in (*METRICS, "slo_attainment")}


def _r4(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def mean_spread(runs: Sequence[float | None]) -> tuple[float | None, float | None]:
    """The runs' mean and spread ((max - min) / mean); both None when a run has no value."""
    values = [v for v in runs if v is not None]
    mean = float(np.mean(values)) if len(values) == len(runs) and values else None
    return mean, ((max(values) - min(values)) / mean if mean else None)


def row(metric: str, predicted: float | None, runs: Sequence[float | None]) -> dict:
    """One metric's line: the pass rule applied (pass None when a side has no value)."""
    measured, spread = mean_spread(runs)
    error = predicted / measured - 1 if predicted is not None and measured else None
    allowed = max(TOLERANCE[metric], SPREAD_FACTOR * spread) if spread is not None else None
    return {"predicted": _r4(predicted), "measured": _r4(measured), "error": _r4(error), "spread": _r4(spread),
            "tolerance": TOLERANCE[metric], "allowed": _r4(allowed),
            "pass": None if error is None or allowed is None else bool(abs(error) <= allowed + 1e-12),
            "runs": [_r4(v) for v in runs]}


def compare(predicted: dict, live: Sequence[dict], before: dict | None = None,
            draws: Sequence[dict] = ()) -> dict:
    """{metric: row} and the verdict: every judged row passes (a row with no value is not judged).
    `before`, a second twin's figures, is set beside each row and not judged; `draws`, the twin's
    runs that `predicted` is the mean of, give each row the twin's own spread (not judged)."""
    rows = {m: row(m, predicted[m], [run[m] for run in live]) for m in METRICS}
    for metric, r in rows.items() if len(draws) > 1 else ():
        r["twin_spread"] = _r4(mean_spread([d[metric] for d in draws])[1])
    for metric, r in rows.items() if before is not None else ():
        b, measured = before[metric], r["measured"]
        r["before"] = {"predicted": _r4(b), "error": _r4(b / measured - 1) if b is not None and measured else None}
    judged = [r["pass"] for r in rows.values() if r["pass"] is not None]
    return {"rows": rows, "pass": bool(judged) and all(judged)}


@dataclass(frozen=True)
class Rung:
    """One rate of the ladder: its live run's figures, and the twins' attainment of the SLO there."""
    rate_per_s: float
    figures: dict
    keeps_up: bool
    twins: dict  # {"twin": attainment, "before": attainment}

    def to_json(self) -> dict:
        return {"rate_per_s": self.rate_per_s, "keeps_up": self.keeps_up,
                **{k: _r4(v) for k, v in self.figures.items()},
                **{f"{name}_slo_attainment": _r4(v) for name, v in self.twins.items()}}


def run_once(live: Run, twins: dict[str, Predict], scen: Scenario, slo: Slo,
             give_up: search.GiveUp | None = None) -> tuple[dict, float, dict]:
    """One live run of `scen` (which may stop early by `give_up`) and one on each twin: the live
    figures, the live run's seconds (first arrival to last token) and each twin's attainment of `slo`."""
    timed = by_ask(scen, live(scen, 0, give_up))
    ends = [t.token_times_ms[-1] for t in timed if len(t.token_times_ms)]
    live_s = (max(ends) - min(t.arrival_ms for t in timed)) / 1000.0 if ends else 0.0
    on_twins = {name: run_figures(by_ask(scen, predict(scen, 0)), slo)["slo_attainment"]
                for name, predict in twins.items()}
    return run_figures(timed, slo), live_s, on_twins


def attainment_of(predict: Predict, slo: Slo) -> Callable[[float, int], float | None]:
    """A twin's attainment of `slo` on the held-out workload at (rate, requests)."""
    def at(rate: float, requests: int) -> float | None:
        scen = workload(rate, requests)
        return run_figures(by_ask(scen, predict(scen, 0)), slo)["slo_attainment"]
    return at


def search_step(live: Run, twins: dict[str, Predict], rate: float, requests: int, slo: Slo) -> search.Step:
    """One rate of the capacity search, live (given up once hopeless: search.GiveUp) and on the twins."""
    scen = workload(rate, requests)
    give_up = search.GiveUp.of(slo, requests, DEFAULT_ATTAINMENT)
    got, live_s, on_twins = run_once(live, twins, scen, slo, give_up)
    arrivals_s = max(spec.arrival_ms for spec in scen.specs(SEED)) / 1000.0
    return search.Step(rate, requests, arrivals_s, live_s, {"live": got["slo_attainment"], **on_twins},
                       give_up.gave_up_after if give_up else None)


def ladder(live: Run, twins: dict[str, Predict], light: float, num_requests: int, slo: Slo,
           rungs: int = LADDER_RUNGS) -> tuple[float, list[Rung]]:
    """Doubling rates from the light one, each run once live (and on the twins), until one no longer
    keeps up (see KEEP_UP, TTFT_RISE): the knee is the last doubling that kept up. When the first
    doubling already fell behind, the knee lies between it and the light rate: REFINE_RUNGS geometric
    midpoints bisect that, and the knee is the highest that kept up, else the lowest tried."""
    got, _, on_twins = run_once(live, twins, workload(light, num_requests), slo)
    out, base = [Rung(light, got, True, on_twins)], got
    per_request = (base["aggregate_tok_s"] or 0.0) / light

    def rung(rate: float) -> Rung:
        got, _, on_twins = run_once(live, twins, workload(rate, num_requests), slo)
        keeps = ((got["aggregate_tok_s"] or 0.0) / rate >= KEEP_UP * per_request
                 and (got["ttft_p50_ms"] or 0.0) <= TTFT_RISE * max(base["ttft_p50_ms"] or 0.0, 1.0))
        out.append(Rung(rate, got, keeps, on_twins))
        return out[-1]

    for i in range(1, rungs + 1):
        if not rung(round(light * 2 ** i, 3)).keeps_up:
            break
    kept = [r.rate_per_s for r in out if r.keeps_up]
    if len(kept) > 1 or len(out) == 1:
        return kept[-1], out
    low, high = light, out[1].rate_per_s  # the first doubling fell behind: the knee lies between
    for _ in range(REFINE_RUNGS):
        tried = rung(round(math.sqrt(low * high), 3))
        low, high = (tried.rate_per_s, high) if tried.keeps_up else (low, tried.rate_per_s)
    return (low if low > light else high), out


def tried_rates(rungs: Sequence[Rung], steps: Sequence[search.Step] = ()) -> list[tuple[float, dict]]:
    """Every rate tried, with each side's attainment: the ladder's under the search's first (and not
    searched again), rising, then the search's (all the ladder's when the search did not run)."""
    first, searched = (steps[0].rate_per_s if steps else float("inf")), {s.rate_per_s for s in steps}
    ladder = [(r.rate_per_s, {"live": r.figures["slo_attainment"], **r.twins}) for r in rungs
              if r.rate_per_s < first and r.rate_per_s not in searched]
    return (sorted(ladder, key=lambda t: t[0])
            + [(s.rate_per_s, s.attained) for s in steps])


def capacity(rungs: Sequence[Rung], slo: Slo, attainment: float = DEFAULT_ATTAINMENT,
             steps: Sequence[search.Step] = (), refined: Mapping[str, Sequence[search.Step]] | None = None) -> dict:
    """Live and on each twin, the sweep's capacity rule (points.capacity: the highest rate at which it
    and every lower rate meet the SLO for >= `attainment` of the requests; None when the lowest
    misses) on every rate tried (tried_rates), and for a twin also on the rates of its own search
    (`refined`, search.refine: in virtual time, recorded under `twin_search`). A side that met every
    rate tried has a capacity of at least the highest: its `bounds` entry says so."""
    refined = refined or {}
    tried = tried_rates(rungs, steps)
    sides = list(tried[0][1]) if tried else ["live"]
    own = lambda side: [(s.rate_per_s, s.attained) for s in refined.get(side, ())]
    met = lambda got, side: got[side] is not None and got[side] >= attainment - points.EPS
    found = points.capacity([{"mode": side, "load": rate, "slo_attainment": got[side]}
                             for side in sides for rate, got in tried + own(side)], attainment)
    bounds = {side: bool(tried) and all(met(got, side) for _, got in tried + own(side)) for side in sides}
    out: dict = {"slo": slo.to_json(), "attainment": attainment, "rates": [rate for rate, _ in tried],
                 **{side: found.get(side) for side in sides}}
    out["error"] = _r4(out["twin"] / out["live"] - 1) if out.get("twin") and out["live"] else None
    out["top_rate_is_a_bound"] = bounds["live"]  # true only when no rate tried missed live
    out["bounds"] = bounds
    out["missed"] = min((rate for rate, got in tried if not met(got, "live")), default=None)
    out["search"] = [s.to_json() for s in steps]
    out["twin_search"] = {side: [{"rate_per_s": s.rate_per_s, "requests": s.requests,
                                  "slo_attainment": _r4(s.attained[side])} for s in more]
                          for side, more in refined.items()}
    out["live_s"] = _r4(sum(s.live_s for s in steps))
    return out


def check(live: Run, twin: Predict, solo_life_ms: float, num_requests: int = NUM_REQUESTS,
          runs: int = LIVE_RUNS, progress: Callable[[str], None] | None = None, before: Predict | None = None,
          slo: Slo | None = None, books: Books | None = None, capacity_rungs: int = search.RUNGS,
          log: Callable[[str], None] | None = None) -> dict:
    """The held-out report: the ladder, the light and knee workloads live `runs` times and once on
    the twin (and on `before`), compared row by row (with `books`, each workload's step books: the
    live runs' mean, and each twin's), then the capacity search under `slo` from the ladder's highest
    rate that met it (at most `capacity_rungs` rates, a line to `log` each). The judged runs come
    right after the ladder, as close to the calibration as they can: a shared host's speed moved
    30-50% within minutes (docs/measurements/2026-12-03-coopsched-books.md)."""
    say, log = progress or (lambda _: None), log or (lambda _: None)
    slo = slo or parse_slo(CAPACITY_SLO)
    twins = {"twin": twin, **({"before": before} if before else {})}
    light = light_rate(solo_life_ms)
    say(f"knee ladder from {light:g} req/s")
    knee, rungs = ladder(live, twins, light, num_requests, slo)
    out: dict = {"rule": RULE, "requests": num_requests, "seed": SEED, "live_runs": runs,
                 "ladder": [r.to_json() for r in rungs], "knee_rate_per_s": knee, "workloads": {}}
    for name, rate in (("light", light), ("knee", knee)):
        scen = workload(rate, num_requests)
        live_figures, live_books, predicted, kept, draws = [], [], {}, {}, {}
        for i in range(runs):
            say(f"{name} workload ({rate:g} req/s) live run {i + 1}/{runs}")
            live_figures.append(run_figures(by_ask(scen, live(scen, i, None)), slo))
            live_books.append(books("live") if books else None)
        for side, predict in twins.items():
            draws[side], side_books = [], []
            for draw in range(TWIN_DRAWS):
                draws[side].append(run_figures(by_ask(scen, predict(scen, draw)), slo))
                side_books.append(books(side) if books else None)
            predicted[side], kept[side] = mean_per_key(draws[side]), mean_per_key(side_books)
        out["workloads"][name] = {"rate_per_s": rate,
                                  **compare(predicted["twin"], live_figures, predicted.get("before"), draws["twin"])}
        live_mean = mean_per_key(live_books)
        if live_mean is not None and all(kept.values()):
            out["workloads"][name]["books"] = {"live": live_mean, **kept}
            out["workloads"][name]["price_drift"] = price_drift(live_mean, kept["twin"])
    out["pass"] = all(w["pass"] for w in out["workloads"].values())
    start = capacity(rungs, slo)["live"]
    if start is None and capacity_rungs:
        log(f"capacity search not run: the light rate {light:g} req/s already misses {slo.describe()}")
    steps = [] if start is None else search.search(
        lambda rate, requests: search_step(live, twins, rate, requests, slo), start, light, slo, num_requests,
        capacity_rungs, DEFAULT_ATTAINMENT, say, log)
    tried = [search.Step(rate, 0, 0.0, 0.0, got) for rate, got in tried_rates(rungs, steps)]
    refined = {side: search.refine(attainment_of(predict, slo), side, tried, light, slo, num_requests,
                                   capacity_rungs, DEFAULT_ATTAINMENT)
               for side, predict in twins.items()} if steps else {}
    out["capacity"] = capacity(rungs, slo, steps=steps, refined=refined)
    return out


def print_check(console, report: dict, title: str) -> None:
    from rich.table import Table

    table = Table(title=title, box=None, pad_edge=False, padding=(0, 1), header_style="bold",
                  caption=f"rule: {report['rule']}")
    before = any("before" in r for w in report["workloads"].values() for r in w["rows"].values())
    columns = ("workload", "metric", "predicted", "twin spread", "measured", "error", "spread", "allowed", "verdict",
               *(("before", "its error") if before else ()))
    for col in columns:
        table.add_column(col, justify="left" if col in ("workload", "metric") else "right", no_wrap=True)
    num = lambda v: "-" if v is None else f"{v:.2f}"
    pct = lambda v: "-" if v is None else f"{v:+.1%}"
    for name, w in report["workloads"].items():
        for metric, r in w["rows"].items():
            verdict = "-" if r["pass"] is None else ("[green]PASS[/]" if r["pass"] else "[red]FAIL[/]")
            b = r.get("before", {})
            table.add_row(f"{name} {w['rate_per_s']:g}/s", metric, num(r["predicted"]),
                          "-" if r.get("twin_spread") is None else f"{r['twin_spread']:.1%}", num(r["measured"]),
                          pct(r["error"]), "-" if r["spread"] is None else f"{r['spread']:.1%}",
                          "-" if r["allowed"] is None else f"{r['allowed']:.0%}", verdict,
                          *((num(b.get("predicted")), pct(b.get("error"))) if before else ()))
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
    drifts = {name: w["price_drift"] for name, w in report["workloads"].items() if w.get("price_drift") is not None}
    if not report["pass"] and any(abs(d) > DRIFT_NOTE for d in drifts.values()):
        console.print("the server's own steps cost " + ", ".join(f"{d:+.0%} ({name})" for name, d in
                      drifts.items()) + " against the twin's prices of them: its speed moved since it was "
                      "calibrated, and the failed rows measure that move as well as the twin (the books below)",
                      highlight=False, soft_wrap=True)
    console.print(capacity_line(report["capacity"]), highlight=False, soft_wrap=True)
    for name, w in report["workloads"].items():
        if "books" in w:
            console.print(books_line(name, w["books"]), highlight=False, soft_wrap=True)


def capacity_line(cap: dict) -> str:
    """The capacity per side: a side that met every rate tried is 'at least' the highest, the live
    one is bracketed by the lowest rate that missed."""
    def rate(side: str) -> str:
        value = cap[side]
        if value is None:
            return f"none (misses at {min(cap['rates']):g} req/s, the lowest rate tried)" if cap["rates"] else "none"
        return f"at least {value:g} req/s" if cap.get("bounds", {}).get(side) else f"{value:g} req/s"
    slo = Slo(**cap["slo"]).describe()
    searched = len(cap.get("search") or ())
    where = (f"on {searched} searched rates and the ladder's under them ({cap['live_s']:.0f} s live, one run a "
             "rate)" if searched else "on the ladder's rates")
    missed = f" (missed at {cap['missed']:g} req/s)" if cap.get("missed") is not None and cap["live"] else ""
    error = f" (error {cap['error']:+.1%})" if cap["error"] is not None else ""
    twins = "; ".join(f"{name} {rate(name)}{error if name == 'twin' else ''}" for name in ("twin", "before")
                      if name in cap)
    own = sum(len(v) for v in (cap.get("twin_search") or {}).values())
    twins += f" (the twins' own search: {own} more rates in virtual time)" if own else ""
    return (f"capacity under {slo} for >= {cap['attainment']:.0%} of requests, {where}: live {rate('live')}"
            f"{missed}; {twins}")
