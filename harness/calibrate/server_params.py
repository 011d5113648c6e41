"""The scheduler parameters a server does not report, fitted from how it serves a few probes: one
function per server kind, each returning the twin's `server_params`, the evidence it measured (printed
as it goes) and any cost terms its model prices differently from `calibrate --target`'s fit.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from harness.calibrate import fit
from harness.calibrate.target import Server, arrivals_ms, text_prompt
from harness.live import client

Say = Callable[[str], None]

SERIAL_LONG_MS, SERIAL_DELAY_MS = 1500.0, 50.0  # a request decoding longer than a wave, a second sent
                                                # soon after it: does the second wait for the first's end?
CAP_STREAMS, CAP_LONG_MS = 24, 800.0  # more streams than the prefill batch (a decode cap under 24 shows),
                                      # each decoding long enough to outlast the wave they wait for,
CAP_EVERY_MS = 5.0                 # sent this far apart: mlx_lm.server listens with a backlog of 5
WAVE_LONG_MS = 4000.0              # a request decoding this long while probes arrive ...
WAVE_PROBES, WAVE_EVERY_MS = 12, 100.0  # ... one every 100 ms from 100 ms on
DEFAULT_NUM_DRAFT = 3              # mlx_lm.server's --num-draft-tokens default
WAVE_GAP_MS = 40.0                 # first tokens further apart than this start another wave


Fitted = tuple[dict, dict, dict]  # (server_params, evidence, CostModel terms to override)


def fit_params(kind: str, server: Server, profile: dict, fitted: dict, say: Say | None = None) -> Fitted:
    """For a `kind` server whose cost terms are `profile` (CostModel keys) and `fitted` the
    calibration's own fit record (its TTFT points)."""
    fitter = FITTERS.get(kind)
    return fitter(server, profile, fitted, say or (lambda _: None)) if fitter else ({}, {}, {})


def fit_mlx_lm(server: Server, profile: dict, fitted: dict, say: Say) -> Fitted:
    """mlx_lm.server: serialization (a draft model is loaded), then for the batched path its decode
    cap and prefill batch (a concurrency probe) and its wave budget (first tokens' steps); and its
    prefill line, refitted for the prompts a workload sends."""
    step_ms = float(profile["decode_ms"][0][1])  # a decode step at the smallest batch
    cost, evidence = prefill_line(fitted, profile.get("jitter_quantiles") or {})
    say(f"mlx-lm: {evidence['prefill']['says']}")
    serial, evidence["serial"] = serial_probe(server, step_ms)
    say(f"mlx-lm: {evidence['serial']['says']}")
    if serial:  # --num-draft-tokens is not told apart by timing (rounds arrive close together): its default
        cost.update(round_per_token(evidence["serial"], profile, say))
        return {"draft_model": True}, evidence, cost
    cap, prompt, evidence["concurrency"] = concurrency_probe(server, step_ms, float(profile["decode_ms"][-1][1]))
    say(f"mlx-lm: {evidence['concurrency']['says']}")
    wave, evidence["waves"] = wave_probe(server, step_ms)
    say(f"mlx-lm: {evidence['waves']['says']}")
    params = {"draft_model": False, "wave_ms": wave}
    params.update({k: v for k, v in (("decode_concurrency", cap), ("prompt_concurrency", prompt)) if v})
    return params, evidence, cost


def round_per_token(serial: dict, profile: dict, say: Say) -> dict:
    """A round's price from the long serialized stream's mean gap: the rounds' own gaps (timed where
    arrivals group) miss the time inside a group, so the twin's tokens came 30% faster than live."""
    itl = serial["long_itl_ms"]
    accept = profile.get("accept_prob")
    if itl is None or accept is None:
        return {}
    k = DEFAULT_NUM_DRAFT + 1
    round_ms = round(itl * fit.expected_tokens_per_round(accept, k), 4)
    say(f"mlx-lm: a lone speculative stream took {itl:.3f} ms a token: a round of K = {k} at acceptance "
        f"{accept:.2f} is {round_ms:.2f} ms")
    return {"round_ms": [[k, round_ms]], "verify_ms": [[1, round_ms], [k, round_ms]]}


def prefill_line(fitted: dict, quantiles: dict) -> tuple[dict, dict]:
    """One TTFT line over every lone request (mlx_lm.server ignores `speculative`, so its classic and
    speculative probes took one path), fitted on relative error: a least-squares line through prompts
    of 16 to 1024 tokens follows the longest (attention grows past linear) and prices a 40-token
    prompt at twice its TTFT. The twin's first token is priced by this line, drafter or not."""
    points = [(x, y) for key in ("prefill", "slice0") for x, y, *_ in (fitted.get(key) or {}).get("points", [])]
    xs, ys = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    keep = ys > 0
    slope, fixed = np.polyfit(xs[keep], ys[keep], 1, w=1.0 / ys[keep])
    if fixed < 0:  # no negative fixed cost: the line through the origin, same weights
        slope, fixed = float(np.sum(xs[keep] / ys[keep]) / np.sum((xs[keep] / ys[keep]) ** 2)), 0.0
    ratios = [float(y / (fixed + slope * x)) for x, y in zip(xs[keep], ys[keep])]
    residuals = [r - 1 for r in ratios]
    cost = {"prefill_fixed_ms": round(float(fixed), 4), "prefill_per_token_ms": round(float(slope), 5),
            "draft_prefill_per_token_ms": 0.0,  # the spread around this line, not the old one's
            "jitter_quantiles": {**quantiles, "prefill": fit.jitter_quantiles(ratios)}}
    says = (f"TTFT of {int(keep.sum())} lone requests ({int(xs.min())}-{int(xs.max())} tokens), on relative "
            f"error: {fixed:.2f} ms + {slope:.4f} ms a token (median |residual| "
            f"{float(np.median(np.abs(residuals))):.0%})")
    return cost, {"prefill": {**{k: v for k, v in cost.items() if k != "jitter_quantiles"}, "says": says}}


def _times(got) -> list[float]:
    times, counts = arrivals_ms(got)
    return [t for t, n in zip(times, counts) for _ in range(n)]


def serial_probe(server: Server, step_ms: float) -> tuple[bool, dict]:
    """A long request, and a short one sent just after it: serialized when the short one's first token
    follows the long one's last (the long one outlasts a wave, so waves alone do not delay it so)."""
    long_tokens = int(SERIAL_LONG_MS / max(step_ms, 0.5))
    bodies = [server.body(text_prompt(16, "serial:long"), long_tokens, True),
              server.body(text_prompt(16, "serial:short"), 8, True)]
    outs = server.together(bodies, [0.0, SERIAL_DELAY_MS])
    origin = min(o.sent_ns for o in outs)
    a, b = ([t + (o.sent_ns - origin) / 1e6 for t in _times(o)] for o in outs)
    serial = b[0] >= a[-1]
    itl = (a[-1] - a[0]) / (len(a) - 1) if len(a) > 1 else None
    says = (f"a request sent {SERIAL_DELAY_MS:.0f} ms after a long one got its first token {b[0] - a[-1]:.1f} ms "
            "after the long one's last: one request at a time (a draft model is loaded)" if serial else
            f"a request sent {SERIAL_DELAY_MS:.0f} ms after a long one got its first token at {b[0]:.0f} ms, "
            f"{a[-1] - b[0]:.0f} ms before the long one's last: the batched path")
    return serial, {"serial": serial, "first_ms": [a[0], b[0]], "last_ms": [a[-1], b[-1]], "long_itl_ms": itl,
                    "says": says}


def concurrency_probe(server: Server, step_ms: float, batch_step_ms: float) -> tuple[int | None, int | None, dict]:
    """A long request, then CAP_STREAMS more just after it (so they join it together, in one wave):
    the most streams decoding at once (the decode cap, when under all of them) and how many first
    tokens come out of one step (the prefill batch)."""
    tokens = int(CAP_LONG_MS / max(batch_step_ms, 0.5))
    bodies = [server.body(text_prompt(16, "cap:anchor"), int(2 * SERIAL_LONG_MS / max(step_ms, 0.5)), False)]
    bodies += [server.body(text_prompt(16, f"cap:{i}"), tokens, False) for i in range(CAP_STREAMS)]
    outs = server.together(bodies, [0.0] + [SERIAL_DELAY_MS + CAP_EVERY_MS * i for i in range(CAP_STREAMS)])
    origin = min(o.sent_ns for o in outs)
    spans = [(t[0], t[-1]) for t in ([x + (o.sent_ns - origin) / 1e6 for x in _times(o)] for o in outs) if t]
    most = max(sum(first <= t <= last for first, last in spans) for t, _ in spans)
    cap = most if most < len(spans) else None
    firsts = sorted(first for first, _ in spans[1:])
    sizes = cluster_sizes(firsts, max(0.5 * step_ms, 0.5))
    # the largest group: once a decode cap binds, rows join one or two at a time as others finish
    prompt = max(sizes) if len(sizes) > 1 else None
    says = (f"{len(spans) - 1} requests sent just after a long one: at most {most} of the {len(spans)} decoded at "
            "once " + ("(the decode cap)" if cap else f"(no cap under {len(spans)}: the default is kept)")
            + f"; their first tokens came {len(sizes)} steps in groups of {sizes}"
            + (f" (prefill batch {prompt})" if prompt else " (one group: the prefill batch is not seen)"))
    return cap, prompt, {"streams": len(spans), "most_decoding": most, "first_token_groups": sizes,
                         "says": says}


def cluster_sizes(times: Sequence[float], gap_ms: float) -> list[int]:
    """Sizes of the runs of sorted times closer than gap_ms to their neighbour."""
    sizes = [1] if times else []
    for a, b in itertools.pairwise(times):
        if b - a > gap_ms:
            sizes.append(1)
        else:
            sizes[-1] += 1
    return sizes


def wave_probe(server: Server, step_ms: float) -> tuple[float, dict]:
    """A long request decodes while probes arrive every WAVE_EVERY_MS: a server that inserts requests
    in waves gives them first tokens in clusters, one per wave; wave_ms is the clusters' spacing."""
    long_tokens = int(WAVE_LONG_MS / max(step_ms, 0.5))
    bodies = [server.body(text_prompt(16, "wave:long"), long_tokens, False)]
    bodies += [server.body(text_prompt(16, f"wave:{i}"), 2, False) for i in range(WAVE_PROBES)]
    offsets = [0.0] + [WAVE_EVERY_MS * (i + 1) for i in range(WAVE_PROBES)]
    outs = server.together(bodies, offsets)
    origin = min(o.sent_ns for o in outs)
    long_last = _times(outs[0])[-1] + (outs[0].sent_ns - origin) / 1e6
    probes = [o for o in outs[1:] if o.arrivals]
    sent = [(o.sent_ns - origin) / 1e6 for o in probes]
    ttfts = [_times(o)[0] for o in probes]
    firsts = [t + f for t, f in zip(sent, ttfts)]
    wave, starts, spacing = waves_of(sent, ttfts, long_last)
    if wave:
        says = (f"probes arriving every {WAVE_EVERY_MS:.0f} ms while a request decoded got first tokens in "
                f"{len(spacing) + 1} waves {', '.join(f'{s:.0f}' for s in spacing)} ms apart (TTFT up to "
                f"{max(ttfts):.0f} ms): wave_ms {wave}, their mean spacing")
    else:
        says = f"probes arriving while a request decoded started at once (TTFT at most {max(ttfts):.0f} ms): no waves"
    if long_last < max(firsts):
        says += f" (the long request ended at {long_last:.0f} ms, before the last probe started: fewer waves seen)"
    return wave, {"wave_starts_ms": [round(s, 1) for s in starts], "ttft_ms": [round(t, 1) for t in ttfts],
                  "long_ended_ms": round(long_last, 1), "wave_ms": wave, "says": says}


def waves_of(sent_ms: Sequence[float], ttfts: Sequence[float], long_last: float) -> tuple[float, list, list]:
    """(wave_ms, wave starts, their spacing) from probes in the order sent: a probe whose TTFT is
    WAVE_GAP_MS above its predecessor's missed the wave that took it, and starts the next; a wave starts
    at its earliest first token. Only waves while the long request ran count (after it the batch
    drains and a probe starts at once); no waves when every TTFT is under 2 x WAVE_GAP_MS."""
    waves: list[list[float]] = []
    for i, (sent, ttft) in enumerate(zip(sent_ms, ttfts)):
        if not waves or ttft > ttfts[i - 1] + WAVE_GAP_MS:
            waves.append([])
        waves[-1].append(sent + ttft)
    starts = [min(w) for w in waves]
    running = [t for t in starts if t <= long_last]
    spacing = [b - a for a, b in itertools.pairwise(running)]
    wave = (running[-1] - running[0]) / (len(running) - 1) if len(running) > 1 else 0.0
    return (round(wave, 1) if max(ttfts, default=0.0) > 2 * WAVE_GAP_MS else 0.0), starts, spacing


# -- llama.cpp ------------------------------------------------------------------------------------
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


def calibrate_llamacpp(profile: dict, server: Server) -> list[str]:
    """A `calibrate --target` profile of a llama-server (as written) made its twin's: kind, server
    params and step costs, the replaced terms kept in calibrated.replaced."""
    calibrated = profile.setdefault("calibrated", {})
    params, evidence, costs = fit_llama_cpp(server, profile, calibrated.get("fit") or {}, lambda _: None)
    calibrated["replaced"] = evidence["replaced"]
    profile.update(costs, server="llama.cpp", server_params=params)
    calibrated["server_fit"] = evidence
    return evidence["says"]


# -- vLLM -------------------------------------------------------------------------------------------
VLLM_PROBE_REQUESTS, VLLM_PROBE_TOKENS = 16, 48
VLLM_DEFAULT_MAX_NUM_SEQS = 128   # vLLM for CPU: `--max-num-seqs` of its OpenAI server, when the probe sees no cap
VLLM_DEFAULT_BATCHED_TOKENS = 2048  # ... and its `--max-num-batched-tokens`
STEPS = "vllm:iteration_tokens_total_count"


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


def folded(samples: Mapping[str, float] | None) -> dict[str, float]:
    """A scrape with every label set summed per metric name."""
    out: dict[str, float] = {}
    for name, value in (samples or {}).items():
        bare = name.split("{", 1)[0]
        out[bare] = out.get(bare, 0.0) + value
    return out


def spec_positions(samples: Mapping[str, float] | None) -> int:
    """K: the positions vLLM counts accepted drafts at (one label per proposed token)."""
    return len({name.split("position=", 1)[1].split(",", 1)[0] for name in samples or {}
                if name.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total") and "position=" in name})


def ngram_acceptance(before: Mapping[str, float], after: Mapping[str, float], k: int) -> tuple[float, str] | None:
    """(accept_prob for K drafts a row-step, evidence) from the counters' change over the calibration:
    every decode row-step emits 1 + its accepted drafts, so row-steps = output tokens - first tokens
    - accepted; rows ngram found no match for propose nothing, and the twin folds them in (it
    proposes K for every row), so the acceptance is the one that gives the same tokens per row-step."""
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    drafts, drafted = delta.get("vllm:spec_decode_num_drafts_total", 0.0), delta.get(
        "vllm:spec_decode_num_draft_tokens_total", 0.0)
    accepted = delta.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    generated = delta.get("vllm:generation_tokens_total", 0.0)
    requests = delta.get("vllm:request_success_total", 0.0)
    row_steps = generated - requests - accepted
    if not drafted or row_steps <= 0:
        return None
    per_step = (generated - requests) / row_steps
    accept = fit.acceptance_from_tokens(per_step, k + 1)
    return accept, (f"vllm:spec_decode_*: {accepted:.0f} of {drafted:.0f} draft tokens accepted over {drafts:.0f} "
                    f"proposals in {row_steps:.0f} row-steps ({drafts / row_steps:.0%} proposed): "
                    f"{per_step:.3f} tokens a row-step -> accept_prob {accept:.4f} at K={k}")


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
                 num_tokens: int = VLLM_PROBE_TOKENS) -> float | None:
    """One engine step with `batch` rows decoding: `batch` requests sent together, the time from the
    first first token to the last token over the steps vLLM counted between them
    (`vllm:iteration_tokens_total_count`); the clients' delivery bunching cancels out."""
    before = folded(scrape())
    outs = server.together([server.body(text_prompt(16, f"step:{batch}:{i}:{time.monotonic_ns()}"), num_tokens, False)
                            for i in range(batch)])
    after = folded(client.settled(scrape))
    steps = after.get(STEPS, 0.0) - before.get(STEPS, 0.0)
    origin = min(o.sent_ns for o in outs)
    times = [arrivals_ms(o, origin)[0] for o in outs]
    firsts, lasts = [t[0] for t in times if t], [t[-1] for t in times if t]
    if steps < 2 or not firsts:
        return None
    return (max(lasts) - min(firsts)) / (steps - 1)



def step_costs(server: Server, scrape: Callable[[], dict[str, float] | None],
               batches: tuple[int, ...], repeats: int = 3) -> dict[int, float]:
    """The median step per batch size, over `repeats` probes each (round-robin, so load spreads)."""
    samples: dict[int, list[float]] = {b: [] for b in batches}
    for _ in range(repeats):
        for b in batches:
            ms = vllm_step_ms(server, scrape, b)
            if ms is not None:
                samples[b].append(ms)
    return {b: float(np.median(xs)) for b, xs in samples.items() if xs}


def fit_vllm(server: Server, profile: dict, fitted: dict, say: Say) -> Fitted:
    """What the vllm twin needs beyond the cost fit: max_num_seqs (a concurrency probe), K and the
    acceptance (vllm:spec_decode_*), one step's cost per batch (iteration counts), and the
    frontend's share of TTFT (vLLM's own queue and prefill times beside the clients' TTFT)."""
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
    timed = folded(client.settled(scrape))
    ttfts = probe_ttfts(server) + hot_ttfts(server)
    after = folded(client.settled(scrape))
    points = [[b, round(v, 4)] for b, v in zip(steps, fit.monotone(list(steps.values())))]
    out.cost.update(decode_ms=points, round_ms=None, draft_per_token_ms=0.0, draft_prefill_per_token_ms=0.0,
                    fused_padding="ragged", switch_ms=0.0, jitter_quantiles=None)
    out.note("one step (vllm:iteration_tokens_total between first and last tokens): "
             + ", ".join(f"B={b} {ms:.2f} ms" for b, ms in points))
    if k:
        out.params["num_speculative_tokens"] = k
        out.cost["verify_ms"] = [[b * (k + 1), ms] for b, ms in points]  # a step verifies 1 + K a row
        accept = ngram_acceptance(before, after, k)
        if accept is not None:
            out.cost["accept_prob"] = round(accept[0], 4)
            out.note(accept[1])
    else:
        out.cost.update(verify_ms=[points[0]], accept_prob=None)
        out.note("no vllm:spec_decode_num_accepted_tokens_per_pos positions: no speculation configured")
    _fit_prefill(out, timed, after, ttfts)
    return out.params, {"vllm": out.lines}, out.cost


def _fit_prefill(out: VllmFit, before: Mapping[str, float], after: Mapping[str, float], ttfts: list[float]) -> None:
    """The TTFT the engine never sees (HTTP, tokenizing, IPC, delivery): the clients' median TTFT
    (a stalled client's outliers pulled the mean up by half) less vLLM's own mean queue + prefill
    time over the same requests (`vllm:request_*_time_seconds`).
    vLLM folds a new prompt into the running rows' one forward, so a prompt adds its tokens to a
    step, not a second forward's fixed cost (a twin charging that in every mixed step over-predicted
    ITL): `prefill_fixed_ms` is 0, and a lone request's own step is not priced (predicted early)."""
    delta = {n: after.get(n, 0.0) - before.get(n, 0.0) for n in after}
    count = delta.get("vllm:request_prefill_time_seconds_count", 0.0)
    if not ttfts or count != len(ttfts):
        out.note(f"frontend_ms not measured: {len(ttfts)} TTFTs timed, vLLM counted {count:.0f}")
        return
    engine = 1e3 * (delta.get("vllm:request_queue_time_seconds_sum", 0.0)
                    + delta.get("vllm:request_prefill_time_seconds_sum", 0.0)) / count
    client_ms = float(np.median(ttfts))
    out.params["frontend_ms"] = round(max(client_ms - engine, 0.0), 3)
    out.cost["prefill_fixed_ms"] = 0.0
    out.note(f"frontend_ms {out.params['frontend_ms']}: TTFT {client_ms:.2f} ms at the client (median), "
             f"{engine:.2f} ms queued + prefilling in vLLM (mean of {count:.0f} requests, lone and "
             "sent while others decode)")


def hot_ttfts(server: Server, num_requests: int = 4) -> list[float]:
    """TTFTs of two requests decoding and a third sent 60 ms after them (the engine busy)."""
    out = []
    for i in range(num_requests):
        bodies = [server.body(text_prompt(16, f"hot:{i}:{j}:{time.monotonic_ns()}"), n, False)
                  for j, n in enumerate((32, 32, 8))]
        for got in server.together(bodies, [0.0, 0.0, 60.0]):
            times, _ = arrivals_ms(got)
            out += times[:1]
    return out


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


FITTERS: dict[str, Callable[[Server, dict, dict, Say], Fitted]] = {
    "mlx-lm": fit_mlx_lm, "llama.cpp": fit_llama_cpp, "vllm": fit_vllm}
