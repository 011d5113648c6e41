"""llama-server: what it reports (slots, a draft model), its draft cap, and its step costs by width and by
the cache each step reads, from its own counts; its frontend time, which the twin delays arrivals by, and
the core time each arrival's HTTP work takes from the slot loop (frontend_stall_ms), what each streamed
token costs it to wake the HTTP threads of the requests waiting in the server (wake_ms), and how much
later a request sent to a server that sat idle reaches it (idle_wake_ms)."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence

from harness.calibrate import fit
from harness.calibrate.target import ACCEPT_CHARS, ACCEPT_PROBES, ACCEPT_TOKENS, Server, spread_prompts, text_prompt
from harness.live import client
from mocks.cost import CostModel

from .context import context_slope, mean_cached
from .idle import idle_ttfts, idle_wake
from .kinds import Fitted, Say
from .stall import stall_probe

PROBE_TOKENS = 64   # a lone speculative request's budget: its rounds give the draft cap
FRONTEND_PROBES = 5
# every width up to 4: a 3-row step costs about what 4 rows do on llama.cpp CPU, over the line between 2 and 4
STEP_ROWS, STEP_TOKENS, STEP_REPEATS = (1, 2, 3, 4), 48, 5  # 5 passes: one stalled pass moves no median
STEP_PROMPT, LONG_PROMPT = 16, 512  # characters: the points' prompts, and the long one (at most half a slot)
LONG_ROWS = (1, 4)  # the points timed again at the long prompt
# wake_ms: every slot holding a stream of this many tokens, with this many requests queued behind them
# (each stream timed from its WAKE_SETTLE-th token on, when the queued requests' own HTTP work is done)
WAKE_TOKENS, WAKE_SETTLE, WAKE_QUEUED, WAKE_REPEATS = 128, 32, (0, 12, 24), 3
# accept_prob: lone speculative requests with prompts spread over the served lengths (target.ACCEPT_*;
# the drafter's agreement moves with the text: three prompts read 0.60 and 0.69 in two calibrations of
# one server; 15 pools of 24 on five servers read 0.713-0.816, a 24-pool's sd 0.036 in the accepted
# share; 64: 0.022)


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
    prompt time the server's `timings.prompt_ms` counted (HTTP, tokenizing, the hand-over). The least
    of the probes: another process on the core only lengthens it (seen: 2.1-98 ms at a load of 6,
    0.6-0.8 ms on a quiet core), and the fitter takes it out of the prompt's fixed cost."""
    gaps = [ttft - prompt_ms for ttft, prompt_ms in pairs]
    ms = max(min(gaps), 0.0) if gaps else 0.0
    shown = ", ".join(f"{g:.2f}" for g in gaps)
    return round(ms, 4), f"frontend_ms = {ms:.3f}: the least client TTFT - timings.prompt_ms ({shown} ms)"


def fit_llamacpp(server: Server) -> tuple[dict, list[str]]:
    """Ask the server (/props, /slots), then time a few lone requests as the calibration sends them."""
    url, body = server.url, server.body
    params, evidence = llamacpp_reported(client.get_json(url, "/props"), client.get_json(url, "/slots"))
    pairs = []
    for i in range(FRONTEND_PROBES):
        got = client.collect(url, body(text_prompt(16, f"frontend:{i}"), 2, False))
        timings = got.timings
        times = got.token_times_ms(got.sent_ns)
        if timings and times and isinstance(timings.get("prompt_ms"), (int, float)):
            pairs.append((times[0], float(timings["prompt_ms"])))
    frontend, line = frontend_overhead(pairs)
    evidence.append(line)
    if pairs:
        params["frontend_ms"] = frontend
    params["idle_wake_ms"], line = idle_wake(idle_ttfts(server))
    evidence.append(line)
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


def _timed(server: Server, rows: int, chars: int, speculates: bool, key: str) -> tuple[float, float, float] | None:
    """One pass of `rows` requests of STEP_TOKENS decoding together: the step on the server's clock,
    as the client sees it, and the rows' mean cached tokens (None: nothing was timed)."""
    before = client.spec_counters(client.settled(lambda: client.try_scrape(server.url)))
    outs = server.together([server.body(text_prompt(chars, f"{key}:{i}"), STEP_TOKENS, False) for i in range(rows)])
    after = client.spec_counters(client.settled(lambda: client.try_scrape(server.url)))
    timed = [(float(t["predicted_ms"]), int(t["predicted_n"]), got.token_times_ms(got.sent_ns),
              int(t.get("prompt_n", 0)) + int(t.get("cache_n", 0)))
             for got, t in ((o, o.timings) for o in outs) if t and t.get("predicted_n")]
    rounds = None
    if speculates and before is not None and after is not None:
        rounds = (after["drafts"] - before["drafts"]) / rows
    if not timed or (rounds is not None and rounds <= 0):
        return None
    cached = statistics.mean(mean_cached(p, n) for _, n, _, p in timed)
    return (step_ms([(ms, n) for ms, n, _, _ in timed], rounds),
            step_ms([(times[-1] - times[0], n) for _, n, times, _ in timed if times], rounds), cached)


def _measured(server: Server, rows_each: Sequence[int], chars: int,
              speculates: bool) -> dict[int, tuple[float, float, float, list, list]]:
    """STEP_REPEATS rounds of a pass at each width in `rows_each`, interleaved (the machine's speed
    moves for seconds at a time: a slow spell shorter than the probe then lengthens one pass of each
    width, which no median sees, not several of one width). Per width: the least step on the
    server's clock (a busy core only lengthens a step, so the least is the compute's), the median of
    the step's price, the median cached tokens, and each pass's client and server figures. A pass is
    priced as the client saw it, but never under the server's own time: a first token delivered
    late, bunched with the next, shortens the client's span."""
    got: dict[int, list] = {rows: [] for rows in rows_each}
    for rep in range(STEP_REPEATS):
        for rows in rows_each:
            if t := _timed(server, rows, chars, speculates, f"step:{rows}:{chars}:{rep}"):
                got[rows].append(t)
    return {rows: (min(g[0] for g in passes), statistics.median(max(g[0], g[1]) for g in passes),
                   statistics.median(g[2] for g in passes), [g[1] for g in passes], [g[0] for g in passes])
            for rows, passes in got.items() if passes}


def llamacpp_costs(server: Server, speculates: bool, n_max: int) -> tuple[dict, list[str]]:
    """Step costs with the server's own step counts, STEP_ROWS requests decoding together: the
    decode step at B rows (no draft model), or the step of B verify rows of K = n_max + 1 positions
    (a draft call and one verify batch), priced as a verify of B x K positions. A step is priced as
    the client sees it (the server's time plus its host and delivery work, which share the core);
    the server's own time is the evidence beside it. A lone row at a long prompt prices the
    positions' attention over their caches (context_per_token_ms), and the B-row points are that
    step less their own rows' share."""
    positions = n_max + 1 if speculates else 1
    measured, evidence = _measured(server, STEP_ROWS, STEP_PROMPT, speculates), []
    shown = lambda values: ", ".join(f"{x:.3f}" for x in values)
    for rows, (ms, client_ms, cached, seen, own) in measured.items():
        evidence.append(f"{'verify' if speculates else 'decode'} step at B={rows}: {client_ms:.3f} ms (median), "
                        f"at least {ms:.3f} ms on the server's clock (timings.predicted_ms), so "
                        f"{client_ms - ms:+.3f} ms of host, delivery and a busy core a step (over "
                        f"{'rounds' if speculates else 'tokens - 1'}; the client's {shown(seen)}, the server's "
                        f"{shown(own)}; {cached:.0f} tokens cached a row)")
    if not measured:
        return {}, ["no step timed from the server's timings: the calibrated decode terms are kept"]
    slope, line = _context_term(server, measured, speculates, positions)
    evidence.append(line)
    points = [[rows * positions, round(max(client_ms - slope * rows * positions * cached, 0.0), 4)]
              for rows, (_, client_ms, cached, _, _) in measured.items()]
    costs: dict = {"decode_ms": points, "context_per_token_ms": round(slope, 6)}
    if speculates:  # every step's positions priced alike: a verify batch, and a decode or fused step by its width
        costs.update(verify_ms=points, round_ms=None, draft_per_token_ms=0.0, fused_padding="ragged")
    return costs, evidence


def _context_term(server: Server, measured: dict, speculates: bool, positions: int) -> tuple[float, str]:
    """context_per_token_ms: the lone row and the LONG_ROWS rows again at LONG_PROMPT characters (at most
    half a slot's context), each against its own short point; the mean of their slopes."""
    chars = min(LONG_PROMPT, (server.context_tokens or 2 * LONG_PROMPT) // 2)
    slopes, said = [], []
    for rows, long in _measured(server, [r for r in LONG_ROWS if r in measured], chars, speculates).items():
        short = measured[rows]
        # on the server's clock: the slope is the compute's, whatever the delivery does
        slopes.append(context_slope((short[0], short[2]), (long[0], long[2]), rows * positions))
        said.append(f"B={rows}: {long[0]:.3f} ms at {long[2]:.0f} tokens cached a row against {short[0]:.3f} ms "
                    f"at {short[2]:.0f}")
    if not slopes:
        return 0.0, "context_per_token_ms = 0: no step timed at a short and a long prompt"
    slope = statistics.mean(slopes)
    return slope, (f"context_per_token_ms = {slope:.6f}: steps at a long prompt ({'; '.join(said)}), over "
                   f"{positions} position(s) a row (each position's attention reads its row's cache); the points "
                   "above are priced less their own rows' share")


def prompt_fixed(profile: dict, frontend_ms: float, evidence: list[str]) -> dict:
    """The prompt forward's fixed cost without the frontend: the TTFT fit's intercept holds both, but
    the frontend runs before the slot loop sees the request (the twin delays each arrival by
    frontend_ms), so a step that joins a prompt to the generating slots is not charged it."""
    fixed = profile.get("prefill_fixed_ms")
    if not frontend_ms or not isinstance(fixed, (int, float)):
        return {}
    ms = round(max(fixed - frontend_ms, 0.0), 4)
    evidence.append(f"prefill_fixed_ms = {ms:g}: the TTFT fit's {fixed:g} less the frontend's {frontend_ms:g} ms "
                    "(the twin delays each arrival by it instead)")
    return {"prefill_fixed_ms": ms}


def queue_wake(passes: Sequence[tuple[int, float]], parallel: int) -> tuple[float, str]:
    """wake_ms: the slots' streams' time a token with `queued` requests waiting for a slot, against
    none: every token the server sends wakes every waiting request's HTTP thread, so each step's
    tokens (`parallel` x a stream's tokens that step) cost queued x that many wakes, and a stream's
    time a token grows by parallel x queued wakes. The slope of the passes' medians per queued
    request, over `parallel`; never under 0."""
    by_queued: dict[int, list[float]] = {}
    for queued, ms in passes:
        by_queued.setdefault(queued, []).append(ms)
    if len(by_queued) < 2:
        return 0.0, "wake_ms = 0: the streams were not timed both with and without requests queued"
    xs = sorted(by_queued)
    medians = [statistics.median(by_queued[q]) for q in xs]
    slope = statistics.linear_regression(xs, medians).slope
    ms = round(max(slope / parallel, 0.0), 5)
    shown = ", ".join(f"{m:.3f} ms with {q} queued" for q, m in zip(xs, medians))
    return ms, (f"wake_ms = {ms:g}: {parallel} slots' streams took {shown} a token (tokens {WAKE_SETTLE}-"
                f"{WAKE_TOKENS} as the client saw them, median of {WAKE_REPEATS}): {slope * 1000:.1f} us per "
                f"queued request, over the {parallel} tokens a step sends (each wakes every waiting request's "
                "HTTP thread)")


def wake_probe(server: Server, parallel: int) -> tuple[float, str]:
    """Every slot streams WAKE_TOKENS greedy tokens; WAKE_QUEUED one-token requests arrive just after
    and wait for a slot until the streams end. Each stream is timed from its WAKE_SETTLE-th token (the
    queued arrivals' own HTTP work is done by then) to its last, at every queue length alike.
    WAKE_REPEATS passes at each queue length, interleaved."""
    key = f"wake:{time.monotonic_ns()}"
    passes = []
    for rep in range(WAKE_REPEATS):
        for queued in WAKE_QUEUED:
            bodies = [server.body(text_prompt(STEP_PROMPT, f"{key}:{rep}:{queued}:s{i}"), WAKE_TOKENS, False)
                      for i in range(parallel)]
            bodies += [server.body(text_prompt(STEP_PROMPT, f"{key}:{rep}:{queued}:q{i}"), 1, False)
                       for i in range(queued)]
            outs = server.together(bodies, [0.0] * parallel + [5.0] * queued)
            per_token = [(t[-1] - t[WAKE_SETTLE]) / (len(t) - 1 - WAKE_SETTLE)
                         for t in (got.token_times_ms() for got in outs[:parallel]) if len(t) > WAKE_SETTLE + 1]
            if len(per_token) == parallel:
                passes.append((queued, statistics.mean(per_token)))
    return queue_wake(passes, parallel)


def acceptance(server: Server, n_max: int, probes: int = ACCEPT_PROBES) -> tuple[float | None, str]:
    """accept_prob over `probes` lone speculative requests (ACCEPT_TOKENS each, prompts of
    ACCEPT_CHARS characters evenly spread), from the server's own counters: the accepted share of the
    tokens drafted, as the per-draft acceptance that gives as many tokens a round at K = n_max + 1."""
    scrape = lambda: client.spec_counters(client.settled(lambda: client.try_scrape(server.url)))
    before = scrape()
    for prompt in spread_prompts("accept", probes):
        client.collect(server.url, server.body(prompt, ACCEPT_TOKENS, True))
    after = scrape()
    low, high = ACCEPT_CHARS
    if before is None or after is None or before.get("accepted") is None or after.get("accepted") is None:
        return None, "accept_prob: the server counts no accepted drafts (/metrics); the timing fit's is kept"
    drafted, accepted = after["draft_tokens"] - before["draft_tokens"], after["accepted"] - before["accepted"]
    if drafted <= 0:
        return None, f"accept_prob: {probes} speculative requests drafted nothing; the timing fit's is kept"
    p = fit.acceptance_from_tokens(1 + accepted / drafted * n_max, n_max + 1)
    return round(p, 4), (f"accept_prob = {p:.4f}: {accepted:g} of {drafted:g} draft tokens accepted over {probes} "
                         f"lone requests ({low}-{high}-character prompts, {ACCEPT_TOKENS} tokens each): "
                         f"{accepted / drafted:.3f} a draft token, as tokens a round at K = {n_max + 1}")


def fit_llama_cpp(server: Server, profile: dict, fitted: dict, say: Say) -> Fitted:
    """llama-server: what it reports (slots, a draft model), the draft cap from its counters, and its
    step costs over the steps it counted (`fit_params`' form: params, evidence, cost overrides)."""
    params, lines = fit_llamacpp(server)
    speculates = bool(params.get("draft_model", fitted.get("speculates")))
    n_max = int(params.get("spec_draft_n_max", 3))
    costs, more = llamacpp_costs(server, speculates, n_max)
    if speculates:
        accept, line = acceptance(server, n_max)
        if accept is not None:
            costs["accept_prob"] = accept
        more.append(line)
    costs.update(prompt_fixed(profile, float(params.get("frontend_ms", 0.0)), more))
    stall, line = stall_probe(server, CostModel(**{**profile, **costs}), speculates)
    params["frontend_stall_ms"] = stall
    more.append(line)
    params["wake_ms"], line = wake_probe(server, int(params.get("parallel", 4)))
    more.append(line)
    for line in (*lines, *more):
        say(f"llama.cpp: {line}")
    defaults = CostModel().to_json()  # a term the profile lacks is replaced from its default (0: off)
    return params, {"says": [*lines, *more], "replaced": {k: profile.get(k, defaults.get(k)) for k in costs}}, costs

