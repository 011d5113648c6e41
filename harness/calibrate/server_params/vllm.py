"""vLLM: its running cap, step cost per batch and by the rows' caches, K and ngram acceptance from its
own /metrics; a prompt-only step's forward, a prompt token's price in a forward, its frontend's share of
TTFT, and the engine-core time each arrival's frontend work takes."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from harness.calibrate import fit
from harness.calibrate.target import (
    ACCEPT_CHARS,
    ACCEPT_PROBES,
    ACCEPT_TOKENS,
    Server,
    arrivals_ms,
    spread_prompts,
    text_prompt,
)
from harness.live import client
from harness.live.client import folded

from .context import context_slope, mean_cached
from .kinds import Fitted, Say

VLLM_PROBE_REQUESTS, VLLM_PROBE_TOKENS = 16, 48
VLLM_DEFAULT_MAX_NUM_SEQS = 128   # vLLM for CPU: `--max-num-seqs` of its OpenAI server, when the probe sees no cap
VLLM_DEFAULT_BATCHED_TOKENS = 2048  # ... and its `--max-num-batched-tokens`
STEPS = "vllm:iteration_tokens_total_count"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
STEP_PROMPT, LONG_PROMPT = 16, 448  # characters: the step points' prompts, the long one (4 of them fit the budget)
LONG_ROWS = (1, 4)  # the points timed again at the long prompt
# a stream decoding past 16 arrivals 30 ms apart (an arrival's window, send to first token, is 3-8 ms).
# 8 arrivals 90 ms apart outlasted an ngram stream of 600 tokens (about 550 ms on 2026-12-07): 4 of 8
# counted, and two calibrations read 1.8 and 3.9 ms an arrival
STALL_ARRIVALS, STALL_GAP_MS, STALL_TOKENS = 16, 30.0, 600


@dataclass
class VllmFit:
    """What fit_vllm finds as it goes: each evidence line is said when it is found."""
    say: Say
    params: dict = field(default_factory=dict)
    cost: dict = field(default_factory=dict)      # CostModel terms vLLM's own counts correct
    lines: list[str] = field(default_factory=list)

    def note(self, line: str) -> None:
        self.lines.append(line)
        self.say(f"vllm: {line}")


def spec_positions(samples: Mapping[str, float] | None) -> int:
    """K: the positions vLLM counts accepted drafts at (one label per proposed token)."""
    return len({name.split("position=", 1)[1].split(",", 1)[0] for name in samples or {}
                if name.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total") and "position=" in name})


@dataclass(frozen=True)
class Proposals:
    """What vLLM's counters say its proposer did: the share of row-steps it proposed at, a proposal's
    mean length, and the per-draft acceptance that emits what those proposals emitted."""
    share: float
    length: float
    accept: float
    evidence: str


def ngram_acceptance(before: Mapping[str, float], after: Mapping[str, float], k: int) -> Proposals | None:
    """The proposals over the counters' change: every decode row-step emits 1 + its accepted drafts,
    so row-steps = output tokens - first tokens - accepted; ngram proposes only where its prompt lookup
    matches (vLLM counts one draft a proposing row-step), with draft tokens / drafts tokens each (under
    K where a match lies near the text's end), and a proposing row-step emits 1 + accepted / drafts."""
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    drafts, drafted = delta.get("vllm:spec_decode_num_drafts_total", 0.0), delta.get(
        "vllm:spec_decode_num_draft_tokens_total", 0.0)
    accepted = delta.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    generated = delta.get("vllm:generation_tokens_total", 0.0)
    requests = delta.get("vllm:request_success_total", 0.0)
    row_steps = generated - requests - accepted
    if not drafts or not drafted or row_steps <= 0:
        return None
    share = min(drafts / row_steps, 1.0)
    length = min(max(drafted / drafts, 1.0), float(k))
    per_proposal = 1 + accepted / drafts
    accept = fit.acceptance_from_tokens(per_proposal, 1 + length)
    return Proposals(share, length, accept, (
        f"vllm:spec_decode_*: {accepted:.0f} of {drafted:.0f} draft tokens accepted over {drafts:.0f} proposals "
        f"in {row_steps:.0f} row-steps -> propose_share {share:.4f}, draft_tokens {length:.3f} (K={k}); "
        f"{per_proposal:.3f} tokens a proposing row-step -> accept_prob {accept:.4f}"))


def proposals_probe(server: Server, scrape: Callable[[], dict[str, float] | None], k: int) -> Proposals | None:
    """The proposals over ACCEPT_PROBES lone requests like served ones (prompts of ACCEPT_CHARS
    characters evenly spread, ACCEPT_TOKENS each), from vLLM's counters around them. ngram's matches
    move with the text: over the step probes' 16-character prompts its proposals held 3.02 tokens and
    were accepted at 0.714, over these 3.28 at 0.818, over the held-out text 3.30 at 0.805 (2026-12-07)."""
    before = folded(client.settled(scrape))
    for prompt in spread_prompts("proposals"):
        server.collect(server.body(prompt, ACCEPT_TOKENS, True))
    return ngram_acceptance(before, folded(client.settled(scrape)), k)


def row_step_positions(proposals: Proposals | None) -> float:
    """The mean positions a row-step verified in the probes a context slope is measured over: 1, plus
    a proposal's length where the proposer drafted (ngram drafts only where its lookup matches, `share`
    of row-steps). A slope per row-step over this is the twin's price a position: dividing by 1 + K
    priced a measured 0.39 share's context at 2026-12-07's calibration and the other row-steps' at a
    fifth of it, and the twin's steps ran 10-13% under the server's."""
    return 1.0 if proposals is None else 1 + proposals.length * proposals.share


def concurrency_cap(server: Server, num_requests: int = VLLM_PROBE_REQUESTS) -> tuple[int | None, str]:
    """How many requests the server runs at once: `num_requests` sent together, those whose first token
    came before any request finished were running together; None when all of them did (no cap seen)."""
    bodies = [server.body(text_prompt(16, f"probe:{i}"), VLLM_PROBE_TOKENS, False) for i in range(num_requests)]
    outs = server.together(bodies)
    origin = min(o.sent_ns for o in outs)
    firsts, lasts = zip(*[(t[0], t[-1]) for t in (arrivals_ms(o, origin)[0] for o in outs) if t])
    running = sum(f < min(lasts) for f in firsts)
    if running >= len(firsts):
        return None, f"all {len(firsts)} probe requests ran together: no cap below {len(firsts)} seen"
    return running, (f"{running} of {len(firsts)} probe requests had their first token before the first "
                     f"finished at {min(lasts):.0f} ms; the others waited for a running place")


def vllm_step_ms(server: Server, scrape: Callable[[], dict[str, float] | None], batch: int,
                 num_tokens: int = VLLM_PROBE_TOKENS, chars: int = STEP_PROMPT) -> tuple[float, float] | None:
    """One engine step with `batch` rows decoding, and the rows' mean cached tokens over it: `batch`
    requests sent together, the time from the first first token to the last token over the steps
    vLLM counted between them (`vllm:iteration_tokens_total_count`); the clients' delivery bunching
    cancels out. The prompts' tokens are vLLM's own count (`vllm:prompt_tokens_total`)."""
    before = folded(scrape())
    outs = server.together([server.body(text_prompt(chars, f"step:{batch}:{chars}:{i}:{time.monotonic_ns()}"),
                                        num_tokens, False) for i in range(batch)])
    after = folded(client.settled(scrape))
    steps = after.get(STEPS, 0.0) - before.get(STEPS, 0.0)
    prompts = after.get(PROMPT_TOKENS, 0.0) - before.get(PROMPT_TOKENS, 0.0)
    origin = min(o.sent_ns for o in outs)
    times = [arrivals_ms(o, origin)[0] for o in outs]
    firsts, lasts = [t[0] for t in times if t], [t[-1] for t in times if t]
    if steps < 2 or not firsts:
        return None
    return (max(lasts) - min(firsts)) / (steps - 1), mean_cached(prompts / batch, num_tokens)


def step_costs(server: Server, scrape: Callable[[], dict[str, float] | None], batches: tuple[int, ...],
               repeats: int = 3, chars: int = STEP_PROMPT) -> dict[int, tuple[float, float, float]]:
    """Per batch size over `repeats` probes each (round-robin, so load spreads): the median step,
    the least (a busy core only lengthens a step) and the median cached tokens a row."""
    samples: dict[int, list[tuple[float, float]]] = {b: [] for b in batches}
    for _ in range(repeats):
        for b in batches:
            got = vllm_step_ms(server, scrape, b, chars=chars)
            if got is not None:
                samples[b].append(got)
    return {b: (float(np.median([m for m, _ in xs])), min(m for m, _ in xs), float(np.median([c for _, c in xs])))
            for b, xs in samples.items() if xs}


def own_points(steps: dict[int, tuple[float, float, float]], slope: float) -> list[list[float]]:
    """[B, ms] per batch size: the median step less its rows' attention over what they cached
    (`slope` ms per cached token a row), which the twin charges by each row's own cache; made
    monotone in B."""
    own = [max(ms - slope * b * cached, 0.0) for b, (ms, _, cached) in steps.items()]
    return [[b, round(v, 4)] for b, v in zip(steps, fit.monotone(own))]


def context_term(server: Server, scrape: Callable[[], dict[str, float] | None],
                 short: dict[int, tuple[float, float, float]]) -> tuple[float, str]:
    """context_per_token_ms: the LONG_ROWS steps again at LONG_PROMPT characters, each against its own
    short point (the least of the passes of each: the compute's), the mean of their slopes."""
    long = step_costs(server, scrape, tuple(b for b in LONG_ROWS if b in short), chars=LONG_PROMPT)
    slopes = [context_slope((short[b][1], short[b][2]), (got[1], got[2]), b) for b, got in long.items()]
    if not slopes:
        return 0.0, "context_per_token_ms 0: no step timed at a long prompt"
    slope = float(np.mean(slopes))
    said = "; ".join(f"B={b}: {got[1]:.3f} ms at {got[2]:.0f} tokens cached a row against {short[b][1]:.3f} ms "
                     f"at {short[b][2]:.0f}" for b, got in long.items())
    return slope, (f"context_per_token_ms {slope:.6f}: the least step at a long prompt ({said}; slopes "
                   + ", ".join(f"{x:.6f}" for x in slopes) + "); the points are priced less their own rows' share")


def fit_vllm(server: Server, profile: dict, fitted: dict, say: Say) -> Fitted:
    """What the vllm twin needs beyond the cost fit: max_num_seqs (a concurrency probe), K and the
    acceptance (vllm:spec_decode_*), one step's cost per batch (iteration counts) and per cached token
    (the same at a long prompt), the frontend's stall of the engine's core (a stream's steps around
    arrivals) and its share of TTFT (vLLM's own queue and prefill times beside the clients' TTFT)."""
    out = VllmFit(say)
    scrape: Callable[[], dict[str, float] | None] = lambda: client.try_scrape(server.url)
    raw = scrape()
    if raw is None or STEPS not in folded(raw):
        raise RuntimeError(f"{server.url}/metrics has no {STEPS}: the vllm twin's step costs are read from vLLM's "
                           "own counters (start vLLM without --disable-log-stats)")
    before = folded(raw)
    cap, why = concurrency_cap(server)
    out.params["max_num_seqs"] = cap or VLLM_DEFAULT_MAX_NUM_SEQS
    out.note(f"max_num_seqs {out.params['max_num_seqs']}: {why}"
             + ("" if cap else f"; vLLM's default {VLLM_DEFAULT_MAX_NUM_SEQS} assumed"))
    out.params["max_num_batched_tokens"] = VLLM_DEFAULT_BATCHED_TOKENS
    out.note(f"max_num_batched_tokens {VLLM_DEFAULT_BATCHED_TOKENS}: vLLM's default for its OpenAI server "
             "(not exposed; it binds only when prompts arriving together exceed it)")
    k = spec_positions(raw)
    batches = tuple(b for b in (1, 2, 4, 8) if b <= int(out.params["max_num_seqs"]))
    steps = step_costs(server, scrape, batches)
    slope, why = context_term(server, scrape, steps)
    timed = folded(client.settled(scrape))
    lone = probe_ttfts(server)
    alone = folded(client.settled(scrape))
    probed = ngram_acceptance(before, timed, k) if k else None
    width = row_step_positions(probed)
    points = own_points(steps, slope)
    out.cost.update(decode_ms=points, round_ms=None, draft_per_token_ms=0.0, draft_prefill_per_token_ms=0.0,
                    fused_padding="ragged", switch_ms=0.0, jitter_quantiles=None,
                    context_per_token_ms=round(slope / width, 7))
    out.note("one step (vllm:iteration_tokens_total between first and last tokens): "
             + ", ".join(f"B={b} {ms:.2f} ms at {cached:.0f} tokens cached" for b, (ms, _, cached) in steps.items()))
    out.note(why if probed is None else f"{why}, over {width:.2f} positions a row-step (1 + draft_tokens "
             f"{probed.length:.2f} x the probes' propose share {probed.share:.3f}) -> {slope / width:.7f} a position")
    stall_probe(out, server, profile)
    stream_spread(out, server)
    if k:
        out.params["num_speculative_tokens"] = k
        out.cost["verify_ms"] = [[b * (k + 1), ms] for b, ms in points]  # a step verifies 1 + K a row
        draft_price(out, profile.get("round_ms"), steps[1][0] if 1 in steps else None, k)
        proposals = proposals_probe(server, scrape, k)
        if proposals is not None:
            out.cost["accept_prob"] = round(proposals.accept, 4)
            out.params.update(propose_share=round(proposals.share, 4), draft_tokens=round(proposals.length, 3))
            low, high = ACCEPT_CHARS
            out.note(f"{ACCEPT_PROBES} lone requests ({low}-{high}-character prompts, {ACCEPT_TOKENS} tokens "
                     f"each): {proposals.evidence}")
    else:
        out.cost.update(verify_ms=[points[0]], accept_prob=None)
        out.note("no vllm:spec_decode_num_accepted_tokens_per_pos positions: no speculation configured")
    per_token = out.cost.get("prefill_per_token_ms", profile.get("prefill_per_token_ms"))
    prompt_forward(out, timed, alone, float(per_token or 0.0))
    _fit_prefill(out, timed, alone, lone)
    busy_frontend(out, beside_frontends(server, scrape))
    return out.params, {"vllm": out.lines}, out.cost


def draft_price(out: VllmFit, round_points: list | None, lone_step_ms: float | None, k: int) -> None:
    """draft_position_ms: what a lone step with K drafts (the timing fit's round at K, the steps whose
    tokens came several at once) took beyond vLLM's lone decode step, per draft token, so the twin's
    round costs the server's. Without a round, a draft token is priced as a prompt token."""
    at_k = [ms for width, ms in round_points or [] if width == k]
    if at_k and lone_step_ms is not None:
        price = round(max(at_k[0] - lone_step_ms, 0.0) / k, 5)
        why = (f"a lone round of K={k} took {at_k[0]:.2f} ms (the timing fit's), a lone decode step "
               f"{lone_step_ms:.2f} (vLLM's count above): {price} ms a draft token beside its row's decode")
    else:
        price = out.cost.get("prefill_per_token_ms")
        why = "no lone round timed: a draft token priced as a prompt token in the forward"
    if price is not None:
        out.cost["draft_position_ms"] = price
        out.note(f"draft_position_ms {price}: {why}")


def _fit_prefill(out: VllmFit, before: Mapping[str, float], after: Mapping[str, float], ttfts: list[float]) -> None:
    """The TTFT the engine never sees (HTTP, tokenizing, IPC, delivery) of a request sent to an idle
    engine: the lone requests' median client TTFT less vLLM's own mean queue + prefill time over the
    same requests (`vllm:request_*_time_seconds`). Fitted on requests sent while others decode as
    well, it read 8-15 ms against 4.1-4.2 lone (2026-12-03) and the light workload's TTFT p50 came
    out 63-77% long: the engine's own queueing, which the twin models, was counted twice."""
    delta = {n: after.get(n, 0.0) - before.get(n, 0.0) for n in after}
    count = delta.get("vllm:request_prefill_time_seconds_count", 0.0)
    if not ttfts or count != len(ttfts):
        out.note(f"frontend_ms not measured: {len(ttfts)} TTFTs timed, vLLM counted {count:.0f}")
        return
    engine = 1e3 * (delta.get("vllm:request_queue_time_seconds_sum", 0.0)
                    + delta.get("vllm:request_prefill_time_seconds_sum", 0.0)) / count
    client_ms = float(np.median(ttfts))
    out.params["frontend_ms"] = round(max(client_ms - engine, 0.0), 3)
    out.note(f"frontend_ms {out.params['frontend_ms']}: TTFT {client_ms:.2f} ms at the client (median), "
             f"{engine:.2f} ms queued + prefilling in vLLM (mean of {count:.0f} lone requests)")


def prompt_forward(out: VllmFit, before: Mapping[str, float], after: Mapping[str, float], per_token_ms: float) -> None:
    """prefill_fixed_ms: the forward a prompt-only step runs (the engine idle, only new prompts in
    it), from lone requests: vLLM's mean time from scheduling them to their first token
    (`vllm:request_prefill_time_seconds`) less their prompts (`vllm:prompt_tokens_total`) at the
    per-token price. A prompt in a step with decode rows pays none of it (`shared_prefill_fixed_ms`
    0): vLLM runs one forward a step, and the decode points price it (a twin charging a second
    forward in every mixed step over-predicted ITL)."""
    delta = {n: after.get(n, 0.0) - before.get(n, 0.0) for n in after}
    count = delta.get("vllm:request_prefill_time_seconds_count", 0.0)
    out.cost["shared_prefill_fixed_ms"] = 0.0
    if not count:
        out.cost["prefill_fixed_ms"] = 0.0
        out.note("prefill_fixed_ms 0 (not measured): vLLM counted no lone request's prefill time")
        return
    prefill_ms = 1e3 * delta.get("vllm:request_prefill_time_seconds_sum", 0.0) / count
    tokens = delta.get(PROMPT_TOKENS, 0.0) / count
    out.cost["prefill_fixed_ms"] = round(max(prefill_ms - per_token_ms * tokens, 0.0), 4)
    out.note(f"prefill_fixed_ms {out.cost['prefill_fixed_ms']}: {count:.0f} lone requests took {prefill_ms:.2f} ms "
             f"from scheduled to first token in vLLM (mean), less their {tokens:.0f}-token prompts at "
             f"{per_token_ms:g} ms a token; a prompt beside decode rows is in their forward "
             "(shared_prefill_fixed_ms 0)")


def beside_frontends(server: Server, scrape: Callable[[], dict[str, float] | None],
                     num_requests: int = 6) -> list[float]:
    """The frontend part of TTFT for requests sent while the engine is in a step: two long streams
    decode, a third short request is sent 60 ms after them, and its client TTFT less its own queue +
    prefill time in vLLM (the one request that finished between the scrapes either side of it: vLLM
    books those times when a request finishes). A pair whose scrapes count another is dropped."""
    out = []
    with ThreadPoolExecutor(1) as pool:
        for i in range(num_requests):
            streams = [server.body(text_prompt(16, f"beside:{i}:{j}:{time.monotonic_ns()}"), 96, False) for j in (0, 1)]
            before = folded(scrape() or {})
            running = pool.submit(server.together, streams)
            time.sleep(0.06)
            got = server.collect(server.body(text_prompt(16, f"beside:{i}:third:{time.monotonic_ns()}"), 8, False))
            after = folded(scrape() or {})
            running.result()
            delta = {n: after.get(n, 0.0) - before.get(n, 0.0) for n in after}
            times, _ = arrivals_ms(got)
            if delta.get("vllm:request_prefill_time_seconds_count") == 1 and times:
                engine = 1e3 * (delta.get("vllm:request_queue_time_seconds_sum", 0.0)
                                + delta.get("vllm:request_prefill_time_seconds_sum", 0.0))
                out.append(times[0] - engine)
    return out


def busy_frontend(out: VllmFit, beside: list[float]) -> None:
    """frontend_busy_ms: what a request sent while the engine is in a step takes before vLLM sees
    it beyond a lone one's `frontend_ms` (its API server waits for the engine's core), the median
    over `beside_frontends`; 0 and said so without a lone figure or a kept pair."""
    lone = out.params.get("frontend_ms")
    if lone is None or not beside:
        out.note(f"frontend_busy_ms not measured: {len(beside)} requests sent beside decoding streams kept")
        return
    extra = float(np.median(beside)) - float(lone)  # type: ignore[arg-type]
    out.params["frontend_busy_ms"] = round(max(extra, 0.0), 3)
    out.note(f"frontend_busy_ms {out.params['frontend_busy_ms']}: {len(beside)} requests sent while two others "
             f"decode took {float(np.median(beside)):.2f} ms (median; "
             + ", ".join(f"{ms:.1f}" for ms in beside) + f") before vLLM saw them, a lone one {lone} ms")


def probe_ttfts(server: Server, num_requests: int = 6) -> list[float]:
    """Lone requests one after another (what the frontend share is measured on); their TTFTs."""
    ttfts = []
    for i in range(num_requests):
        got = server.collect(server.body(text_prompt(32, f"frontend:{i}"), 24, True))
        times, _ = arrivals_ms(got)
        if times:
            ttfts.append(times[0])
        time.sleep(0.02)
    return ttfts


def arrival_stalls(stream_ms: list[float], arrivals: list[tuple[float, float]]) -> tuple[float, list[float]]:
    """(a decoding stream's median gap, and per arrival (send, first token), on the stream's clock,
    how much longer than that median the stream's gaps from the send to that first token took): what
    the arrival cost the engine's core besides its own prompt. Arrivals after the stream are left out."""
    gaps = list(pairwise(stream_ms))
    base = float(np.median([b - a for a, b in gaps])) if gaps else 0.0
    excess = []
    for send, first in arrivals:
        if not stream_ms or first >= stream_ms[-1]:
            continue  # the stream was over (ngram's bunched tokens end it early): nothing to stretch
        window = [b - a for a, b in gaps if b > send and a < first]
        excess.append(sum(window) - base * len(window))
    return base, excess


def arrival_excess(server: Server, scrape: Callable[[], dict[str, float] | None],
                   chars: int) -> tuple[float, list[float], float]:
    """One request decoding STALL_TOKENS (within the context) at a STEP_PROMPT prompt while STALL_ARRIVALS
    one-token requests of `chars`-character prompts are sent STALL_GAP_MS apart: (the stream's
    median gap, per arrival the stretch of the stream's steps from its send to its first token, the
    prompt tokens vLLM counted for all of them)."""
    before = folded(client.settled(scrape))
    key = time.monotonic_ns()
    tokens = stream_tokens(server)
    bodies = [server.body(text_prompt(STEP_PROMPT, f"stall:{key}"), tokens, False)] + [
        server.body(text_prompt(chars, f"stall:{key}:{i}"), 1, False) for i in range(STALL_ARRIVALS)]
    outs = server.together(bodies, [0.0] + [STALL_GAP_MS * (i + 1) for i in range(STALL_ARRIVALS)])
    after = folded(client.settled(scrape))
    origin = outs[0].sent_ns
    sent = [((o.sent_ns - origin) / 1e6, arrivals_ms(o, origin)[0]) for o in outs[1:]]
    base, excess = arrival_stalls(arrivals_ms(outs[0], origin)[0], [(s, t[0]) for s, t in sent if t])
    return base, excess, after.get(PROMPT_TOKENS, 0.0) - before.get(PROMPT_TOKENS, 0.0)


def stream_tokens(server: Server) -> int:
    """A probe stream's budget: STALL_TOKENS, within the server's context beside its prompt."""
    return min(STALL_TOKENS, (server.context_tokens or 2 * STALL_TOKENS) - 2 * STEP_PROMPT)


def step_spread(gaps_ms: list[float]) -> list[float] | None:
    """A lone stream's steps as jitter quantiles (gap over the mean): one SSE event a step, whatever
    tokens it carried, so every gap between events is one step. The twin's steps had no spread:
    under ngram its classic ITL p99 at the light rate came out 21-30% low on six servers
    (2026-12-07), where a lone stream's p99 step was 1.3x its median."""
    steps = [g for g in gaps_ms if g > 0]
    return fit.jitter_quantiles(steps) if len(steps) >= 2 else None


def stream_spread(out: VllmFit, server: Server) -> None:
    """jitter_quantiles for every step term (decode, verify, fused) from one lone stream of
    STALL_TOKENS; none when it had too few steps."""
    tokens = stream_tokens(server)
    got = server.collect(server.body(text_prompt(STEP_PROMPT, f"spread:{time.monotonic_ns()}"), tokens, False))
    times, _ = arrivals_ms(got)
    spread = step_spread([b - a for a, b in pairwise(times)])
    if spread is None:
        out.note("jitter_quantiles: a lone stream had too few steps; the twin's steps keep no spread")
        return
    out.cost["jitter_quantiles"] = {term: spread for term in ("decode", "verify", "fused")}
    mid = spread[len(spread) // 2]
    out.note(f"jitter_quantiles: a lone {tokens}-token stream's {len(times) - 1} steps, each over their mean: "
             f"median {mid:.3f}, p90 {spread[int(0.9 * (len(spread) - 1))]:.3f}, max {spread[-1]:.3f} "
             "(every step term)")


def stall_probe(out: VllmFit, server: Server, profile: dict) -> None:
    """frontend_stall_ms and prefill_per_token_ms from what an arrival costs a decoding stream, at a
    short and at a long prompt (`arrival_excess`, the medians over the arrivals): the excess grows by
    the long prompt's extra tokens at a prompt token's price in the forward (one forward a step, so
    the same price alone or beside decode rows); what the short one costs beyond its tokens is the
    API server's work on the engine's core. The TTFT fit's price, which this replaces, carries the
    frontend's per-token work and the noise of nine lone requests (0.059 against 0.017 ms on one
    server); without a long pass it is kept and prices the prompt."""
    scrape: Callable[[], dict[str, float] | None] = lambda: client.try_scrape(server.url)
    base, short, counted = arrival_excess(server, scrape, STEP_PROMPT)
    if not short:
        out.note("frontend_stall_ms not measured: no arrival had a first token")
        return
    short_tokens = counted / (STALL_ARRIVALS + 1)  # the stream's prompt is as long as the arrivals'
    _, long, counted = arrival_excess(server, scrape, LONG_PROMPT)
    long_tokens = (counted - short_tokens) / STALL_ARRIVALS
    at_short = float(np.median(short))
    per_token = float(profile.get("prefill_per_token_ms") or 0.0)
    if long and long_tokens > short_tokens:
        at_long = float(np.median(long))
        per_token = max((at_long - at_short) / (long_tokens - short_tokens), 0.0)
        out.cost["prefill_per_token_ms"] = round(per_token, 5)
        out.note(f"prefill_per_token_ms {per_token:.5f}: an arrival's {long_tokens:.0f}-token prompt stretched a "
                 f"stream's steps {at_long:.2f} ms (median; " + ", ".join(f"{x:.1f}" for x in long)
                 + f" ms), its {short_tokens:.0f}-token one {at_short:.2f} ms: a prompt token's price in the "
                 f"forward (the TTFT fit's {float(profile.get('prefill_per_token_ms') or 0.0):g} replaced)")
    own = per_token * short_tokens
    out.params["frontend_stall_ms"] = round(max(at_short - own, 0.0), 3)
    out.note(f"frontend_stall_ms {out.params['frontend_stall_ms']}: a stream's steps (median {base:.2f} ms) "
             f"took {at_short:.2f} ms longer over each of {len(short)} arrivals (median; "
             + ", ".join(f"{x:.1f}" for x in short) + f" ms), less {own:.2f} ms of the arrival's "
             f"{short_tokens:.0f}-token prompt: the API server's work shares the engine's core")
