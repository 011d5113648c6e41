"""The llama.cpp twin against llama-server: the same open-loop requests live and in virtual time for
four twins (scheduler and costs told apart), the judged figures with the live runs' spread, and
llama-server's own step books beside the twins' (tools/twin_llamacpp.py, the llamacpp e2e test).
`calibrate --report` (harness/calibrate/heldout.py) is the general check; this one adds the books.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np

from coopsched.core import SchedulerConfig
from harness.calibrate import target, twin
from harness.live import client
from harness.run import runner
from harness.run.scenario import Scenario
from harness.run.workload import Workload
from mocks import CostModel

# lengths unlike the calibration's (16-1024-token prompts, 2-128-token budgets), half speculative
HELD_OUT = {"prompt_len": {"min": 8, "max": 48}, "max_tokens": {"min": 16, "max": 96}, "speculative_share": 0.5}
NUM_REQUESTS = 60
# |error| within this, or within 1.5x the live runs' spread when that is larger
TARGETS = {"aggregate_tok_s": 0.10, "ttft_p50_ms": 0.20, "ttft_p95_ms": 0.25, "itl_mean_ms": 0.10,
           "classic_itl_p99_ms": 0.20}
SPREAD_FACTOR = 1.5


def workload(rate: float, n: int = NUM_REQUESTS, seed: int = 0) -> Scenario:
    """The held-out workload as explicit requests: the same arrivals and lengths live and in the
    twin (a twin's seeds then vary only its acceptance and jitter draws)."""
    table = {"arrival": "poisson", "rate_per_s": rate, "num_requests": n, **HELD_OUT}
    specs = Workload.parse(table, Path(".")).specs(seed)
    return Scenario(f"held-out-{rate:g}", requests=tuple(specs))


def simulate(profile: runner.Profile, scenario: Scenario, config: SchedulerConfig,
             seeds: Iterable[int]) -> tuple[list, list]:
    """The twin's runs and step counters; a request is classic when the client asked so (llama.cpp
    speculates it anyway)."""
    priced = runner.priced(scenario, profile)
    runs, counters = [], []
    for seed in seeds:
        run = runner.execute(priced, config, seed)
        runs.append([twin.served(r.arrival_ms, run.token_times[r.id], r.speculative) for r in run.requests])
        worked = [t for t in run.ticks if t.action.value != "idle"]
        counters.append({"steps": len(worked), "busy_per_step": sum(len(t.request_ids) for t in worked) / len(worked),
                         "drafts": run.scheduler.obs.rounds, "draft_tokens": run.scheduler.obs.drafted_tokens})
    return runs, counters


def server_counters(before: dict, after: dict) -> dict:
    """llama-server's own books over one run: llama_decode calls, busy slots per call, drafts."""
    n = after["llamacpp:n_decode_total"] - before["llamacpp:n_decode_total"]
    busy = (after["llamacpp:n_busy_slots_per_decode"] * after["llamacpp:n_decode_total"]
            - before["llamacpp:n_busy_slots_per_decode"] * before["llamacpp:n_decode_total"])
    return {"steps": n, "busy_per_step": busy / n if n else None,
            "drafts": after["llamacpp:spec_decode_num_drafts_total"] - before["llamacpp:spec_decode_num_drafts_total"],
            "draft_tokens": after["llamacpp:spec_decode_num_draft_tokens_total"]
            - before["llamacpp:spec_decode_num_draft_tokens_total"]}


def mean_counters(rows: list[dict]) -> dict:
    return {k: float(np.mean([r[k] for r in rows if r[k] is not None])) for k in rows[0]}


def twins(profile_path: Path, server: target.Server, speculates: bool) -> dict:
    """{name: (profile, config)}: "coopsched", today's twin (coopsched's scheduler at the costs
    calibrate fitted from token timing); "coopsched+costs", the same scheduler at the costs the
    server kind's calibration replaced them with; "llama.cpp" (the profile's kind), the twin after,
    and "llama.cpp@timing", that scheduler at today's costs."""
    profile = runner.Profile.load(profile_path)
    data = json.loads(profile_path.read_text())
    replaced = (data.get("calibrated") or {}).get("replaced") or {}
    known = set(CostModel.__dataclass_fields__)
    today = CostModel(**{k: v for k, v in {**data, **replaced}.items() if k in known})
    k = int(profile.server_params.get("spec_draft_n_max", 3)) + 1
    before = target.twin_config_of(server, None, k).with_(has_drafter=speculates)
    slots = int(profile.server_params.get("parallel", 4))
    after = SchedulerConfig(block_size=k, has_drafter=speculates, num_kv_slots=max(16, slots),
                            slot_tokens=server.context_tokens or 4096)
    reference = replace(profile, server="coopsched", server_params={})
    return {"coopsched": (replace(reference, cost=today), before), "coopsched+costs": (reference, before),
            f"{profile.server}@timing": (replace(profile, cost=today), after), profile.server: (profile, after)}


def figures(runs: list[list[dict]]) -> dict:
    """Per run and pooled: aggregate tok/s, TTFT p50/p95, mean ITL, classic ITL p99."""
    per_run = [run_figures([run]) for run in runs]
    pooled = run_figures(runs)
    pooled["aggregate_tok_s"] = float(np.mean([f["aggregate_tok_s"] for f in per_run]))
    spread = {k: (max(f[k] for f in per_run) - min(f[k] for f in per_run)) / pooled[k]
              for k in pooled if pooled[k] and all(f[k] is not None for f in per_run)}
    return {"pooled": pooled, "runs": per_run, "spread": spread}


def run_figures(runs: list[list[dict]]) -> dict:
    ttft, gaps, classic, spans, tokens = [], [], [], [], 0
    for run in runs:
        start = min(r["arrival_ms"] for r in run)
        end = max(r["token_times_ms"][-1] for r in run if r["token_times_ms"])
        spans.append(end - start)
        for r in run:
            times = r["token_times_ms"]
            tokens += len(times)
            if times:
                ttft.append(times[0] - r["arrival_ms"])
            steps = [b - a for a, b in pairwise(times)]
            gaps += steps
            if not r["speculative"]:
                classic += steps
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else None
    return {"aggregate_tok_s": 1000.0 * tokens / sum(spans), "ttft_p50_ms": pct(ttft, 50),
            "ttft_p95_ms": pct(ttft, 95), "itl_mean_ms": float(np.mean(gaps)) if gaps else None,
            "classic_itl_p99_ms": pct(classic, 99)}


def live(server: target.Server, scenario: Scenario, runs: int, seed: int = 0, counters: list | None = None,
         before_run: Callable[[], None] | None = None) -> list[list[dict]]:
    """The workload live `runs` times (the same requests each time: the spread is the server's);
    the server's counters over each run appended to `counters`."""
    specs = scenario.requests
    out = []
    for _ in range(runs):
        if before_run:
            before_run()
        before = client.settled(lambda: client.try_scrape(server.url))
        out.append(target.measure_workload(server, specs, seed))
        after = client.settled(lambda: client.try_scrape(server.url))
        if counters is not None and before and after:
            counters.append(server_counters(before, after))
    return out


def error_row(predicted: dict, measured: dict) -> dict:
    rows = {}
    for metric, limit in TARGETS.items():
        p, m = predicted["pooled"].get(metric), measured["pooled"].get(metric)
        spread = measured["spread"].get(metric, 0.0)
        err = None if p is None or not m else p / m - 1
        rows[metric] = {"predicted": p, "measured": m, "error": err, "spread": spread,
                        "within": err is not None and abs(err) <= max(limit, SPREAD_FACTOR * spread)}
    return rows


