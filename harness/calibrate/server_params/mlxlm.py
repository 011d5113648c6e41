"""mlx_lm.server: serialization under a draft model and its round, its decode cap and prompt batch, its waves."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from harness.calibrate import fit
from harness.calibrate.target import Server, arrivals_ms, text_prompt

from .context import context_slope, mean_cached
from .kinds import Fitted, Say

SERIAL_LONG_MS, SERIAL_DELAY_MS = 1500.0, 50.0  # a request decoding longer than a wave, a second sent
                                                # soon after it: does the second wait for the first's end?
CAP_STREAMS, CAP_LONG_MS = 24, 800.0  # more streams than the prefill batch (a decode cap under 24 shows),
                                      # each decoding long enough to outlast the wave they wait for,
CAP_EVERY_MS = 5.0                 # sent this far apart: mlx_lm.server listens with a backlog of 5
WAVE_LONG_MS = 4000.0              # a request decoding this long while probes arrive ...
WAVE_PROBES, WAVE_EVERY_MS = 12, 100.0  # ... one every 100 ms from 100 ms on
DEFAULT_NUM_DRAFT = 3              # mlx_lm.server's --num-draft-tokens default
WAVE_GAP_MS = 40.0                 # first tokens further apart than this start another wave
SAME_LENGTH, SAME_TOKENS = 0.1, 4  # lone prompts this close in length (or tokens) are one length of the line
STREAM_PROMPTS = (24, 96, 192)     # lone speculative streams like the requests a workload serves: prompts
STREAM_BUDGETS = (24, 48, 96)      # (characters) and budgets around a chat turn's ...
STREAM_REPEATS = 4                 # ... each this many times, round-robin (a length's median is its price)
SUPERLINEAR = 1.5                  # the longest length is left out of the line past this x its reach
# context_per_token_ms on the batched path: 1 and 4 rows decoding together at a short and a long prompt
# (characters; the long one within a served request's reach), CONTEXT_PASSES each, the least pass
CONTEXT_ROWS, CONTEXT_PROMPTS, CONTEXT_TOKENS, CONTEXT_PASSES = (1, 4), (16, 256), 48, 3


def fit_mlx_lm(server: Server, profile: dict, fitted: dict, say: Say) -> Fitted:
    """mlx_lm.server: serialization (a draft model is loaded) and then its round (lone streams like
    served ones), else for the batched path its decode cap and prefill batch (a concurrency probe)
    and its wave budget (first tokens' steps); and its prefill line, refitted for the prompts a
    workload sends."""
    step_ms = float(profile["decode_ms"][0][1])  # a decode step at the smallest batch
    cost, evidence = prefill_line(fitted, profile.get("jitter_quantiles") or {})
    say(f"mlx-lm: {evidence['prefill']['says']}")
    serial, evidence["serial"] = serial_probe(server, step_ms)
    say(f"mlx-lm: {evidence['serial']['says']}")
    if serial:  # --num-draft-tokens is not told apart by timing (rounds arrive close together): its default
        evidence["streams"] = stream_probe(server)
        terms, evidence["streams"]["says"] = round_from_streams(evidence["streams"], evidence["serial"], profile)
        say(f"mlx-lm: {evidence['streams']['says']}")
        cost.update(terms)
        return {"draft_model": True}, evidence, cost
    cap, prompt, evidence["concurrency"] = concurrency_probe(server, step_ms, float(profile["decode_ms"][-1][1]))
    say(f"mlx-lm: {evidence['concurrency']['says']}")
    wave, evidence["waves"] = wave_probe(server, step_ms)
    say(f"mlx-lm: {evidence['waves']['says']}")
    slope, short_cached, evidence["context"] = context_probe(server)
    say(f"mlx-lm: {evidence['context']['says']}")
    decode = decode_points(profile["decode_ms"], slope, short_cached, evidence["concurrency"]["wide_step"])
    if decode != profile["decode_ms"]:
        cost.update(decode_ms=decode)
    if slope:
        cost.update(context_per_token_ms=round(slope, 7))
    params = {"draft_model": False, "wave_ms": wave}
    params.update({k: v for k, v in (("decode_concurrency", cap), ("prompt_concurrency", prompt)) if v})
    return params, evidence, cost


def stream_probe(server: Server, prompts: Sequence[int] = STREAM_PROMPTS, budgets: Sequence[int] = STREAM_BUDGETS,
                 repeats: int = STREAM_REPEATS) -> dict:
    """Lone speculative streams of every prompt length and budget, round-robin: per stream [prompt
    characters, budget, prompt tokens, tokens out, ms a token after the first]."""
    points = []
    for rep, chars, budget in itertools.product(range(repeats), prompts, budgets):
        got = server.collect(server.body(text_prompt(chars, f"stream:{rep}:{chars}:{budget}"), budget, True))
        times = _times(got)
        if len(times) > 1:
            prompt = (got.usage or {}).get("prompt_tokens") or chars
            points.append([chars, budget, int(prompt), len(times), round((times[-1] - times[0]) / (len(times) - 1), 4)])
    return {"points": points}


def round_from_streams(streams: dict, serial: dict, profile: dict) -> tuple[dict, str]:
    """A round's price from lone streams like served ones. Their ms a token after the first is a line
    in the tokens their cache holds on average (context.mean_cached), through each (prompt, budget)'s
    median on relative error; a round emits the drafter's mean tokens, and the slope is spread over a
    round's K positions (the twin's context term). The long serialized stream alone (`serial`) priced
    short streams 30% slow: its cache was longer than theirs."""
    accept, k = profile.get("accept_prob"), DEFAULT_NUM_DRAFT + 1
    cells: dict[tuple[int, int], list[list[float]]] = {}
    for chars, budget, *point in streams.get("points") or []:
        cells.setdefault((chars, budget), []).append(point)
    if accept is None or not cells:
        return {}, ("no round priced: " + ("no acceptance was measured" if accept is None else
                                           "no lone stream carried two tokens"))
    xs = np.array([mean_cached(np.mean([p for p, _, _ in c]), round(np.mean([n for _, n, _ in c])))
                   for c in cells.values()], float)
    ys = np.array([float(np.median([y for _, _, y in c])) for c in cells.values()], float)
    fixed, slope = relative_line(xs, ys)
    flat = slope <= 0 or fixed <= 0  # the line falls, or is all context: the streams' median prices every round
    if flat:
        fixed, slope = float(np.median(ys)), 0.0
    per_round = fit.expected_tokens_per_round(accept, k)
    round_ms, per_position = round(fixed * per_round, 4), round(slope * per_round / k, 7)
    long = serial.get("long_itl_ms")
    says = (f"lone speculative streams of {len(cells)} lengths ({xs.min():.0f}-{xs.max():.0f} tokens cached on "
            f"average) took {fixed:.3f} ms + {slope:.5f} ms per cached token a token"
            + (" (their median: the line through them fell)" if flat else "")
            + (f" (the long stream {long:.3f} ms a token)" if long else "")
            + f": a round of K = {k} at acceptance {accept:.2f} is {round_ms:.2f} ms + {per_position:.6f} ms per "
            "cached token a position")
    return {"round_ms": [[k, round_ms]], "verify_ms": [[1, round_ms], [k, round_ms]],
            "context_per_token_ms": per_position}, says


def decode_points(points: Sequence[Sequence[float]], slope: float, cached: float,
                  wide: Sequence[float] | None) -> list[list[float]]:
    """The timing fit's decode points (timed at about `cached` tokens a row), and the concurrency
    probe's wide step (rows, ms, its own cached tokens) past them, each less its rows' share of the
    context term; one non-decreasing line, as more rows never cost less."""
    priced = [(b, ms - slope * b * cached) for b, ms in points]
    if wide and wide[0] > priced[-1][0]:
        rows, ms, wide_cached = wide
        priced.append((rows, ms - slope * rows * wide_cached))
    if not slope and len(priced) == len(points):
        return [list(p) for p in points]
    return [[b, round(max(ms, 0.0), 4)] for (b, _), ms in zip(priced, fit.monotone([ms for _, ms in priced]))]


def rows_step(server: Server, rows: int, chars: int, key: str) -> tuple[float, float] | None:
    """`rows` classic requests decoding together: the median over the streams of (last token - first)
    over the tokens after the first (a whole span: on one core mlx_lm.server bunches its deliveries),
    and the rows' mean cached tokens (their prompts by the server's usage, then half their tokens)."""
    outs = server.together([server.body(text_prompt(chars, f"{key}:{i}"), CONTEXT_TOKENS, False) for i in range(rows)])
    spans, cached = [], []
    for got in outs:
        times = _times(got)
        if len(times) > 1:
            spans.append((times[-1] - times[0]) / (len(times) - 1))
            cached.append(mean_cached(float((got.usage or {}).get("prompt_tokens") or chars), len(times)))
    return (float(np.median(spans)), float(np.mean(cached))) if spans else None


def context_probe(server: Server) -> tuple[float, float, dict]:
    """context_per_token_ms for the batched path: CONTEXT_ROWS rows at a short and a long prompt, the
    least of CONTEXT_PASSES passes each (a busy core only lengthens a step), the mean of the rows'
    slopes per cached token and row. Returns (slope, the short rows' mean cached tokens, evidence):
    the decode points, timed at the short prompt, are priced less their rows' share of it."""
    least: dict[tuple[int, int], tuple[float, float]] = {}
    for rep in range(CONTEXT_PASSES):
        for rows in CONTEXT_ROWS:
            for chars in CONTEXT_PROMPTS:
                got = rows_step(server, rows, chars, f"context:{rep}:{rows}:{chars}")
                if got and ((rows, chars) not in least or got[0] < least[rows, chars][0]):
                    least[rows, chars] = got
    short, long = CONTEXT_PROMPTS
    pairs = [(rows, least[rows, short], least[rows, long]) for rows in CONTEXT_ROWS
             if (rows, short) in least and (rows, long) in least]
    if not pairs:
        return 0.0, 0.0, {"slopes": [], "says": "context_per_token_ms 0: no step timed at a short and a long prompt"}
    slopes = [context_slope(a, b, rows) for rows, a, b in pairs]
    slope, cached = float(np.mean(slopes)), float(np.mean([a[1] for _, a, _ in pairs]))
    said = "; ".join(f"B={rows}: {b[0]:.3f} ms a token at {b[1]:.0f} cached against {a[0]:.3f} at {a[1]:.0f}"
                     for rows, a, b in pairs)
    return slope, cached, {"slopes": slopes, "says": (
        f"context_per_token_ms {slope:.6f}: the least of {CONTEXT_PASSES} passes of rows decoding together ({said}); "
        f"the decode points, timed at about {cached:.0f} tokens cached a row, are priced less their rows' share")}


def prefill_line(fitted: dict, quantiles: dict) -> tuple[dict, dict]:
    """The TTFT line of lone requests (mlx_lm.server ignores `speculative`, so its classic and
    speculative probes took one path): through each prompt length's median (a neighbour's stall in a
    minority of them is not a price), on relative error, leaving out the longest length when it costs
    more than SUPERLINEAR x the line through the others (attention grows past linear there). No
    spread is drawn: a spread taken around a line through every request was mostly the line's misfit
    (every fourth first token drawn 1.6x on a quiet server), and one pooled from the stalls replayed
    the neighbours' load while calibrating, which later runs need not meet. The spread is reported."""
    points = [(x, y) for key in ("prefill", "slice0") for x, y, *_ in (fitted.get(key) or {}).get("points", [])]
    groups = lengths_of([(x, y) for x, y in points if y > 0])
    ratios = [y / float(np.median(ttfts)) for _, ttfts in groups for y in ttfts]
    xs = np.array([x for x, _ in groups], float)
    ys = np.array([np.median(ttfts) for _, ttfts in groups], float)
    fixed, slope = relative_line(xs, ys)
    left_out = ""
    if len(xs) > 2:
        short_fixed, short_slope = relative_line(xs[:-1], ys[:-1])
        reach = short_fixed + short_slope * xs[-1]
        if ys[-1] > SUPERLINEAR * reach:
            fixed, slope = short_fixed, short_slope
            left_out = (f"; {xs[-1]:.0f}-token prompts took {ys[-1]:.0f} ms, {ys[-1] / reach:.1f}x the line "
                        "through the shorter ones: left out (the twin prices prompts that long low)")
    others = {term: qs for term, qs in quantiles.items() if term != "prefill"}  # the timing fit's, around its line
    cost = {"prefill_fixed_ms": round(fixed, 4), "prefill_per_token_ms": round(slope, 5),
            "draft_prefill_per_token_ms": 0.0, "jitter_quantiles": others or None}
    says = (f"TTFT of {len(points)} lone requests at {len(groups)} prompt lengths ({int(xs.min())}-"
            f"{int(xs.max())} tokens), through each length's median on relative error: {fixed:.2f} ms + "
            f"{slope:.4f} ms a token{left_out}; a TTFT over its length's median ran {min(ratios, default=1.0):.2f}-"
            f"{max(ratios, default=1.0):.1f}x, not replayed")
    return cost, {"prefill": {**{k: v for k, v in cost.items() if k != "jitter_quantiles"}, "says": says}}


def lengths_of(points: Sequence[tuple[float, float]]) -> list[tuple[float, list[float]]]:
    """(mean length, its TTFTs) of the points, in order of length: prompts within SAME_TOKENS or
    SAME_LENGTH of the shortest of their run are one length (a probe's text tokenizes to a few
    tokens more or less)."""
    groups: list[list[tuple[float, float]]] = []
    for x, y in sorted(points):
        if not groups or x > groups[-1][0][0] + max(SAME_TOKENS, SAME_LENGTH * groups[-1][0][0]):
            groups.append([])
        groups[-1].append((x, y))
    return [(float(np.mean([x for x, _ in g])), [y for _, y in g]) for g in groups]


def relative_line(xs: np.ndarray, ys: np.ndarray) -> tuple[float, float]:
    """(fixed, slope) of the line through the points on relative error; through the origin (same
    weights) when the fixed cost would be negative, and a flat line for a single length."""
    if len(xs) < 2:
        return float(ys[0]) if len(ys) else 0.0, 0.0
    slope, fixed = np.polyfit(xs, ys, 1, w=1.0 / ys)
    if fixed < 0:
        slope, fixed = float(np.sum(xs / ys) / np.sum((xs / ys) ** 2)), 0.0
    return float(fixed), float(slope)


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
    the most streams decoding at once (the decode cap, when under all of them), how many first
    tokens come out of one step (the prefill batch), and the step while that many decode together
    (`wide_step`: the calibration's own points stop at 8 rows, and the server batches up to its cap)."""
    tokens = int(CAP_LONG_MS / max(batch_step_ms, 0.5))
    bodies = [server.body(text_prompt(16, "cap:anchor"), int(2 * SERIAL_LONG_MS / max(step_ms, 0.5)), False)]
    bodies += [server.body(text_prompt(16, f"cap:{i}"), tokens, False) for i in range(CAP_STREAMS)]
    outs = server.together(bodies, [0.0] + [SERIAL_DELAY_MS + CAP_EVERY_MS * i for i in range(CAP_STREAMS)])
    origin = min(o.sent_ns for o in outs)
    streams = [(t, float((o.usage or {}).get("prompt_tokens") or 16))
               for t, o in (([x + (o.sent_ns - origin) / 1e6 for x in _times(o)], o) for o in outs) if t]
    spans = [(t[0], t[-1]) for t, _ in streams]
    most = max(sum(first <= t <= last for first, last in spans) for t, _ in spans)
    cap = most if most < len(spans) else None
    firsts = sorted(first for first, _ in spans[1:])
    sizes = cluster_sizes(firsts, max(0.5 * step_ms, 0.5))
    # the largest group: once a decode cap binds, rows join one or two at a time as others finish
    prompt = max(sizes) if len(sizes) > 1 else None
    wide = wide_step(streams, spans, most)
    says = (f"{len(spans) - 1} requests sent just after a long one: at most {most} of the {len(spans)} decoded at "
            "once " + ("(the decode cap)" if cap else f"(no cap under {len(spans)}: the default is kept)")
            + f"; their first tokens came {len(sizes)} steps in groups of {sizes}"
            + (f" (prefill batch {prompt})" if prompt else " (one group: the prefill batch is not seen)")
            + (f"; while {most} decoded together a step took {wide[0]:.3f} ms ({wide[1]:.0f} tokens cached a row)"
               if wide else ""))
    return cap, prompt, {"streams": len(spans), "most_decoding": most, "first_token_groups": sizes,
                         "wide_step": [most, *wide] if wide else None, "says": says}


def wide_step(streams: Sequence[tuple[list[float], float]], spans: Sequence[tuple[float, float]],
              rows: int) -> tuple[float, float] | None:
    """(ms a step, mean cached tokens a row) while `rows` streams decoded together: each stream's
    time between its tokens over the tokens, counting only the gaps that every one of those rows
    spanned (a stream's tokens are each a step; a bunched delivery costs nothing and counts its
    tokens), the median over the streams; its rows held their prompt and the tokens so far."""
    per_stream, cached = [], []
    for times, prompt_n in streams:
        gaps = [(b - a, prompt_n + j) for j, (a, b) in enumerate(itertools.pairwise(times), start=1)
                if sum(first <= a and b <= last for first, last in spans) >= rows]
        if len(gaps) > 1:
            per_stream.append(sum(ms for ms, _ in gaps) / len(gaps))
            cached += [c for _, c in gaps]
    return (float(np.median(per_stream)), float(np.mean(cached))) if per_stream else None


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
