"""llama-server: what it reports (slots, a draft model), its draft cap and step costs from its own counts."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from harness.calibrate.target import Server, text_prompt
from harness.live import client

from .kinds import Fitted, Say

PROBE_TOKENS = 64   # a lone speculative request's budget: its rounds give the draft cap
FRONTEND_PROBES = 5
STEP_ROWS, STEP_TOKENS, STEP_REPEATS = (1, 2, 4), 48, 3


def llamacpp_reported(props: dict | None, slots: list | None) -> tuple[dict, list[str]]:
    """What llama-server says of itself: /props total_slots (--parallel), /slots' `speculative`
    (a draft model is loaded and a speculation type set)."""
    params: dict = {}
    evidence = []
    total = (props or {}).get("total_slots")
    if isinstance(total, int) and total > 0:
        params["parallel"] = total
        evidence.append(f"parallel = {total}: /props total_slots")
    else:
        evidence.append("parallel: /props reports no total_slots; the model's default is kept")
    if isinstance(slots, list) and slots:
        speculative = any(bool(s.get("speculative")) for s in slots if isinstance(s, dict))
        params["draft_model"] = speculative
        evidence.append(f"draft_model = {str(speculative).lower()}: /slots' speculative flags (every slot "
                        "speculates with a draft model, whatever a request asks)")
    else:
        evidence.append("draft_model: no /slots (--no-slots); the profile's drafter decides")
    evidence.append("batch_size, cont_batching: not reported; llama-server's defaults (2048, on) are kept")
    return params, evidence


def draft_cap(drafts: float, draft_tokens: float) -> tuple[int | None, str]:
    """--spec-draft-n-max from a lone request's counters: every round drafts the cap but its last
    few (cut to the tokens left), so the mean over rounds rounds up to it."""
    if not drafts:
        return None, "spec_draft_n_max: the server counted no drafts; the model's default is kept"
    mean = draft_tokens / drafts
    cap = max(1, math.ceil(mean - 1e-9))
    return cap, (f"spec_draft_n_max = {cap}: {draft_tokens:g} draft tokens over {drafts:g} rounds of a lone "
                 f"{PROBE_TOKENS}-token request ({mean:.2f} a round; only its last rounds draft fewer)")


def frontend_overhead(pairs: Sequence[tuple[float, float]]) -> tuple[float, str]:
    """Per-request frontend time: a lone request's first token as the client saw it, less the
    prompt time the server's `timings.prompt_ms` counted (HTTP, tokenizing, the hand-over)."""
    gaps = [ttft - prompt_ms for ttft, prompt_ms in pairs]
    ms = max(statistics.median(gaps), 0.0) if gaps else 0.0
    shown = ", ".join(f"{g:.2f}" for g in gaps)
    return round(ms, 4), f"frontend_ms = {ms:.3f}: median of client TTFT - timings.prompt_ms ({shown} ms)"


def fit_llamacpp(server: Server) -> tuple[dict, list[str]]:
    """Ask the server (/props, /slots), then time a few lone requests as the calibration sends them."""
    url, body = server.url, server.body
    params, evidence = llamacpp_reported(client.get_json(url, "/props"), client.get_json(url, "/slots"))
    pairs = []
    for i in range(FRONTEND_PROBES):
        got = client.collect(url, body(text_prompt(16, f"frontend:{i}"), 2, False))
        timings = _timings(got)
        times = got.token_times_ms(got.sent_ns)
        if timings and times and isinstance(timings.get("prompt_ms"), (int, float)):
            pairs.append((times[0], float(timings["prompt_ms"])))
    evidence.append(frontend_overhead(pairs)[1])
    before = client.spec_counters(client.settled(lambda: client.try_scrape(url)))
    client.collect(url, body(text_prompt(32, "draft-cap"), PROBE_TOKENS, True))
    after = client.spec_counters(client.settled(lambda: client.try_scrape(url)))
    if before is None or after is None:
        evidence.append("spec_draft_n_max: no /metrics (start llama-server with --metrics); the default is kept")
    else:
        cap, line = draft_cap(after["drafts"] - before["drafts"], after["draft_tokens"] - before["draft_tokens"])
        if cap is not None:
            params["spec_draft_n_max"] = cap
        evidence.append(line)
    return params, evidence


def step_ms(predicted: Sequence[tuple[float, int]], rounds: float | None) -> float:
    """One step's time over requests that decoded together: each one's generation span (the
    server's `timings.predicted_ms`, or the client's first to last token) over its steps after the
    first token (its tokens - 1, or with a draft model its rounds, which the server counts). A
    whole span, not the gaps between tokens: on one core llama-server streams in bunches."""
    if rounds is not None:
        return statistics.median(ms / rounds for ms, _ in predicted)
    return statistics.median(ms / (n - 1) for ms, n in predicted if n > 1)


def llamacpp_costs(server: Server, speculates: bool, n_max: int) -> tuple[dict, list[str]]:
    """Step costs with the server's own step counts, STEP_ROWS requests decoding together: the
    decode step at B rows (no draft model), or the step of B verify rows of K = n_max + 1 positions
    (a draft call and one verify batch), priced as a verify of B x K positions. A step is priced as
    the client sees it (the server's time plus its host and delivery work, which share the core);
    the server's own time is the evidence beside it."""
    points, evidence = [], []
    for rows in STEP_ROWS:
        served, seen = [], []
        for rep in range(STEP_REPEATS):
            before = client.spec_counters(client.settled(lambda: client.try_scrape(server.url)))
            outs = server.together([server.body(text_prompt(16, f"step:{rows}:{rep}:{i}"), STEP_TOKENS, False)
                                    for i in range(rows)])
            after = client.spec_counters(client.settled(lambda: client.try_scrape(server.url)))
            timed = [(float(t["predicted_ms"]), int(t["predicted_n"]), got.token_times_ms(got.sent_ns))
                     for got, t in zip(outs, map(_timings, outs)) if t and t.get("predicted_n")]
            rounds = None
            if speculates and before is not None and after is not None:
                rounds = (after["drafts"] - before["drafts"]) / rows
            if timed and (rounds is None or rounds > 0):
                served.append(step_ms([(ms, n) for ms, n, _ in timed], rounds))
                seen.append(step_ms([(times[-1] - times[0], n) for _, n, times in timed if times], rounds))
        if served:
            ms, client_ms = statistics.median(served), statistics.median(seen)
            points.append([rows * (n_max + 1) if speculates else rows, round(client_ms, 4)])
            evidence.append(f"{'verify' if speculates else 'decode'} step at B={rows}: {client_ms:.3f} ms as the "
                            f"client sees it, {ms:.3f} ms on the server's clock (timings.predicted_ms), so "
                            f"{client_ms - ms:+.3f} ms of host and delivery a step (over "
                            f"{'rounds' if speculates else 'tokens - 1'}; the client's "
                            f"{', '.join(f'{x:.3f}' for x in seen)})")
    if not points:
        return {}, ["no step timed from the server's timings: the calibrated decode terms are kept"]
    if not speculates:
        return {"decode_ms": points}, evidence
    # every step's positions priced alike: a verify batch, and a decode or fused step by its width
    return {"verify_ms": points, "decode_ms": points, "round_ms": None, "draft_per_token_ms": 0.0,
            "fused_padding": "ragged"}, evidence


def _timings(got: client.Collected) -> dict | None:
    return next((a.event["timings"] for a in reversed(got.arrivals) if isinstance(a.event.get("timings"), dict)),
                None)


def fit_llama_cpp(server: Server, profile: dict, fitted: dict, say: Say) -> Fitted:
    """llama-server: what it reports (slots, a draft model), the draft cap from its counters, and its
    step costs over the steps it counted (`fit_params`' form: params, evidence, cost overrides)."""
    params, lines = fit_llamacpp(server)
    speculates = bool(params.get("draft_model", fitted.get("speculates")))
    costs, more = llamacpp_costs(server, speculates, int(params.get("spec_draft_n_max", 3)))
    for line in (*lines, *more):
        say(f"llama.cpp: {line}")
    return params, {"says": [*lines, *more], "replaced": {k: profile.get(k) for k in costs}}, costs

