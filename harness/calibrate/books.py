"""A server's own step books beside its twin's over the same held-out runs. llama-server's /metrics
counts its llama_decode calls, busy slots per call and drafts; `coopsched serve` books every tick's
kind, rows and wall time and its worker's busy time; vLLM its engine steps that emitted tokens, the
tokens each computed, a row's time from step to step and its proposer's drafts. The twin counts the
same of its own run. Books that agree show the twin schedules as the server does, which token
timing alone cannot; where a tick's cost differs, the priced tick is what is off (`calibrate
--report` keeps them for all three).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from harness.live.client import folded

DECODES, BUSY = "llamacpp:n_decode_total", "llamacpp:n_busy_slots_per_decode"
DRAFTS, DRAFT_TOKENS = "llamacpp:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_draft_tokens_total"
# booked as each request ends: its tokens, and its time from the prompt's end (its first token) to its last token
PREDICTED, PREDICTED_SECONDS = "llamacpp:tokens_predicted_total", "llamacpp:tokens_predicted_seconds_total"

TICKS, TICK_SECONDS = "coopsched_ticks_total", "coopsched_tick_seconds_total"
ENGINE_BUSY = "coopsched_engine_busy_seconds_total"
VLLM_STEPS = "vllm:iteration_tokens_total"  # a histogram: one observation a step that emitted a token
VLLM_GENERATED = "vllm:generation_tokens_total"
VLLM_ITL = "vllm:inter_token_latency_seconds"  # a histogram: one observation a row's step after its first, engine-side
VLLM_SPEC = {"drafts": "vllm:spec_decode_num_drafts_total", "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
             "accepted": "vllm:spec_decode_num_accepted_tokens_total"}  # only with a speculative config

PRICED = ("admit", "slice0", "decode", "round")  # the tick kinds a twin prices (their mean ms each)
FREE = ("idle", "park")  # no model work: not a step in either book


def server_books(before: Mapping[str, float] | None, after: Mapping[str, float] | None) -> dict | None:
    """The server's books over one run, from the /metrics scrapes either side of it: llama-server's
    coopsched's or vLLM's, whichever it keeps; None when a scrape lacks them (llama-server without
    --metrics)."""
    if not before or not after:
        return None
    return _llama_books(before, after) or coopsched_books(before, after) or _vllm_books(before, after)


def _llama_books(before: Mapping[str, float], after: Mapping[str, float]) -> dict | None:
    """Its busy slots per decode is a running mean over every decode since it started: the run's own
    mean is undone from the two. `gen_token_ms`: the requests' generation time on the server's clock
    (each one's first token to its last) over their tokens, so HTTP delivery is left out; None
    from a server that does not book it."""
    if any(n not in before or n not in after for n in (DECODES, BUSY, DRAFTS, DRAFT_TOKENS)):
        return None
    steps = after[DECODES] - before[DECODES]
    busy = after[BUSY] * after[DECODES] - before[BUSY] * before[DECODES]
    tokens = after.get(PREDICTED, 0.0) - before.get(PREDICTED, 0.0)
    gen_s = after.get(PREDICTED_SECONDS, 0.0) - before.get(PREDICTED_SECONDS, 0.0)
    return {"steps": steps, "busy_per_step": busy / steps if steps else None,
            "drafts": after[DRAFTS] - before[DRAFTS], "draft_tokens": after[DRAFT_TOKENS] - before[DRAFT_TOKENS],
            "gen_token_ms": gen_s * 1e3 / tokens if tokens > 0 and PREDICTED_SECONDS in after else None}


def _vllm_books(before: Mapping[str, float], after: Mapping[str, float]) -> dict | None:
    """Steps are those that emitted a token (a step that only prefilled part of a prompt is not
    observed); a step's tokens are the prompt tokens it computed and the tokens it emitted. Without
    a speculative config vLLM serves no draft counters: none drafted."""
    old, new = folded(before), folded(after)
    count = f"{VLLM_STEPS}_count"
    if count not in old or count not in new:
        return None
    delta = {key: new.get(name, 0.0) - old.get(name, 0.0) for key, name in
             {"steps": count, "tokens": f"{VLLM_STEPS}_sum", "emitted": VLLM_GENERATED,
              "gaps": f"{VLLM_ITL}_count", "gap_s": f"{VLLM_ITL}_sum", **VLLM_SPEC}.items()}
    gaps, gap_ms = delta.pop("gaps"), delta.pop("gap_s") * 1e3
    return _vllm_row(delta.pop("steps"), delta.pop("tokens"), delta.pop("emitted"), gap_ms / gaps if gaps else None,
                     delta)


def _vllm_row(steps: float, tokens: float, emitted: float, step_ms: float | None, drafts: Mapping[str, float]) -> dict:
    """`step_ms`: a row's mean time from one of its steps to the next (vLLM's inter-token latency,
    stamped by its engine core: what a step costs as its rows see it, HTTP left out)."""
    return {"steps": steps, "tokens_per_step": tokens / steps if steps else None,
            "emitted_per_step": emitted / steps if steps else None, "step_ms": step_ms, **drafts}


def tick_counts(samples: Mapping[str, float]) -> dict[tuple[str, int], list[float]]:
    """{(kind, rows): [ticks, seconds]} of a coopsched scrape."""
    out: dict[tuple[str, int], list[float]] = {}
    for name, value in samples.items():
        bare, _, labels = name.partition("{")
        if bare in (TICKS, TICK_SECONDS):
            pairs = dict(item.split("=", 1) for item in labels.rstrip("}").split(",") if "=" in item)
            key = (pairs.get("kind", "").strip('"'), int(pairs.get("rows", '"0"').strip('"')))
            out.setdefault(key, [0.0, 0.0])[bare == TICK_SECONDS] += value
    return out


def tick_delta(before: Mapping[str, float], after: Mapping[str, float]) -> tuple[dict, float] | None:
    """({(kind, rows): [ticks, ms]} booked between two coopsched scrapes, the worker's busy ms between
    them); None when they lack the books."""
    if ENGINE_BUSY not in before or ENGINE_BUSY not in after:
        return None
    old, new = tick_counts(before), tick_counts(after)
    delta = {key: [n - old.get(key, [0.0, 0.0])[0], (s - old.get(key, [0.0, 0.0])[1]) * 1e3]
             for key, (n, s) in new.items() if key[0] not in FREE}
    return {key: v for key, v in delta.items() if v[0] > 0}, (after[ENGINE_BUSY] - before[ENGINE_BUSY]) * 1e3


def overhead_ms(ticks: Mapping[tuple[str, int], list[float]], busy_ms: float) -> float:
    """The worker's time per tick outside the model calls (planning, commit, deliveries): what a tick
    costs beyond its own span, which a twin's price (timed from one tick to the next) carries."""
    count = sum(n for n, _ in ticks.values())
    return max(busy_ms - sum(ms for _, ms in ticks.values()), 0.0) / count if count else 0.0


def coopsched_books(before: Mapping[str, float], after: Mapping[str, float]) -> dict | None:
    delta = tick_delta(before, after)
    if delta is None:
        return None
    ticks, busy = delta
    extra = overhead_ms(ticks, busy)
    return _tick_books({key: [n, ms + extra * n] for key, (n, ms) in ticks.items()}, busy)


def _tick_books(ticks: Mapping[tuple[str, int], list[float]], busy_ms: float) -> dict:
    count = sum(n for n, _ in ticks.values())
    out: dict = {"ticks": count, "rows_per_tick": sum(n * rows for (_, rows), (n, _) in ticks.items()) / count
                 if count else None}
    for kind in PRICED:
        n = sum(v[0] for (k, _), v in ticks.items() if k == kind)
        out[f"{kind}_ms"] = sum(v[1] for (k, _), v in ticks.items() if k == kind) / n if n else None
    return {**out, "busy_ms": busy_ms}


def twin_books(run, kind: str = "llama.cpp") -> dict:
    """The same books of one twin run (runner.execute's result). For llama.cpp: its working steps,
    rows per step, verify rows (one draft each, as llama-server counts a slot's draft), drafted
    tokens and its requests' time a token from first to last (as the server books it); for
    coopsched: its ticks by kind, rows and priced ms, and their sum; for vLLM: its steps,
    the prompt and emitted tokens a step, and its verify rows' drafts (a vLLM draft is one row's
    proposals in one step)."""
    worked = [t for t in run.ticks if t.kind.value not in FREE]
    obs = run.scheduler.obs
    if kind == "vllm":
        emitted = sum(len(r.output_token_ids) for r in run.requests)
        prompt = sum(len(r.prompt_token_ids) for r in run.requests)
        gaps = [b - a for times in run.token_times.values() for a, b in itertools.pairwise(sorted(set(times)))]
        return _vllm_row(len(worked), prompt + emitted, emitted, float(np.mean(gaps)) if gaps else None, {
            "drafts": obs.rounds, "draft_tokens": obs.drafted_tokens, "accepted": obs.accepted_tokens})
    if kind == "coopsched":
        ticks: dict[tuple[str, int], list[float]] = {}
        for t in worked:
            cell = ticks.setdefault((t.kind.value, len(t.request_ids)), [0.0, 0.0])
            cell[0], cell[1] = cell[0] + 1, cell[1] + t.end_ms - t.start_ms
        return _tick_books(ticks, sum(ms for _, ms in ticks.values()))
    spans = [(max(times) - min(times), len(times)) for times in run.token_times.values() if times]
    tokens = sum(n for _, n in spans)
    return {"steps": len(worked), "busy_per_step": sum(len(t.request_ids) for t in worked) / len(worked)
            if worked else None, "drafts": obs.rounds, "draft_tokens": obs.drafted_tokens,
            "gen_token_ms": sum(ms for ms, _ in spans) / tokens if tokens else None}


SAME_STEPS = 0.15  # steps compare when the twin's hold as many rows (tokens, drafts) as the server's, within this
# a kind's step time in its books (vLLM's, llama.cpp's), and the counts that must agree for two to compare
STEP_TIMES = {"step_ms": ("emitted_per_step",), "gen_token_ms": ("busy_per_step", "drafts")}
SINGLE_ROW = ("admit", "slice0", "round")  # ticks of one row: their price does not move with the batch


def price_drift(live: Mapping[str, float | None], twin: Mapping[str, float | None]) -> float | None:
    """How far the server's own steps cost from the twin's prices of them in the same runs. For
    coopsched, its one-row ticks (admit, slice 0, round): the geometric mean of live / twin - 1 over
    the kinds both books hold; for vLLM, a row's step to step time, when the twin's steps emit as
    many tokens as the server's (steps of other sizes differ by the schedule); for llama.cpp, the
    generation time a token on the server's clock, when the twin's steps hold as many busy slots and
    draft as often as the server's (tokens a round move the time a token too). The calibration
    priced those steps, so a drift beyond the tolerances says the server's speed moved between
    calibration and check (a shared machine's does, by half on 2026-12-03) and that the held-out rows
    measure the move as much as the twin; None when no price is in both."""
    for key, counts in STEP_TIMES.items():
        if live.get(key) and twin.get(key):
            if not all(_alike(live.get(count), twin.get(count)) for count in counts):
                return None  # steps of other sizes, or other rounds: their times differ by the schedule
            return float(live[key] / twin[key]) - 1  # type: ignore[operator]
    ratios = [live[f"{k}_ms"] / twin[f"{k}_ms"] for k in SINGLE_ROW if live.get(f"{k}_ms") and twin.get(f"{k}_ms")]
    return float(np.exp(np.mean(np.log(ratios)))) - 1 if ratios else None


def _alike(live: float | None, twin: float | None) -> bool:
    """Two counts within SAME_STEPS of each other (both 0 is alike; one missing is not)."""
    if live is None or twin is None:
        return False
    return live == twin or (live > 0 and abs(twin / live - 1) <= SAME_STEPS)


def mean_per_key(runs: Sequence[dict | None]) -> dict | None:
    """Several runs' books (or figures), averaged per key: None when a run had none, and a key's
    None when any run's is."""
    if not runs or any(r is None for r in runs):
        return None
    return {k: (None if any(r[k] is None for r in runs) else round(float(np.mean([r[k] for r in runs])), 4))
            for k in runs[0]}


def books_line(name: str, books: Mapping[str, dict]) -> str:
    """One workload's books for the report's print-out: live, then each twin with its error."""
    live = books["live"]
    parts = []
    for key in live:
        cells = [f"{key} live {_num(live[key])}"]
        for side, got in books.items():
            if side != "live":
                error = f" ({got[key] / live[key] - 1:+.0%})" if got.get(key) is not None and live[key] else ""
                cells.append(f"{side} {_num(got.get(key))}{error}")
        parts.append(", ".join(cells))
    drift = price_drift(live, books["twin"]) if "twin" in books else None
    moved = (f"; the server's steps cost {drift:+.0%} against the twin's prices of them"
             if drift is not None else "")
    return f"{name} books per run (the server's /metrics vs the twins' counts): " + "; ".join(parts) + moved


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
