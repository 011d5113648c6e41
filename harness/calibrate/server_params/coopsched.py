"""`coopsched serve`: what its own books say. Each response counts its request's rounds
(`timings.draft_rounds`), and /metrics books every tick's kind, rows and wall time and the worker's
busy time (harness/calibrate/books.py). From them, free of how the stream delivered its tokens:
the prefill line from admit ticks, the HTTP layer's part of a TTFT (`frontend_ms`), the drafter's
acceptance over many prompts (three, timed, read 0.52 and 0.75 on one MLX server minutes apart; 12
counted, three times over, agreed within 0.05 tokens a round) and a round's price.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time

import numpy as np

from harness.calibrate import books, fit
from harness.calibrate.target import Server, arrivals_ms, text_prompt
from harness.live import client
from mocks.cost import CostModel

from .kinds import Fitted, Say
from .stall import stall_probe

ACCEPT_PROBES, ACCEPT_CHARS, ACCEPT_TOKENS = 24, (24, 192), 64
ACCEPT_BUDGET_S, ACCEPT_MIN = 3.0, 6  # probes stop after this long, once this many have run (a slow server)
PREFILL_CHARS, PREFILL_REPEATS = (24, 64, 128, 192, 320), 2  # lone one-token prompts around a workload's
BESIDE_TOKENS, BESIDE_START_S = 128, 0.1  # the decoding stream beside them, and its head start
MIN_DECODE_TICKS = 20  # a batch size's decode ticks the calibration booked, at least, to price it from them
STRIDE = 7  # the i-th probe's length: step i x STRIDE (mod ACCEPT_PROBES) of the range: a budget cut keeps the spread
# frontend_stall_ms: twice llama.cpp's arrivals, and more passes: on MLX an arrival's 1.5 ms is 12 ms
# a pass of 8, against passes alone that moved by 20 ms (one probe of 3 read 5.4 ms, one 2.2)
STALL_ARRIVALS, STALL_REPEATS = 16, 5


def _rounds(got: client.Collected) -> tuple[int, int] | None:
    """(tokens after the first, rounds) the server counted for a request, or None."""
    timings = got.timings
    if not timings or not timings.get("draft_rounds"):
        return None
    return int(timings["predicted_n"]) - 1, int(timings["draft_rounds"])


def round_books(server: Server, k: int, calibration: dict | None = None,
                probes: int = ACCEPT_PROBES) -> tuple[dict, list[str]]:
    """accept_prob and the round's price over up to `probes` lone speculative requests (prompts of
    ACCEPT_CHARS characters spread evenly, ACCEPT_TOKENS each; ACCEPT_BUDGET_S of them at most, once
    ACCEPT_MIN ran): tokens a round from the responses' round counts; the price from the round
    ticks' own wall time plus each tick's share of the worker's time outside model calls, pooled
    with the `calibration`'s books (its passes spread over a minute, where these take seconds: one
    slow stretch of the machine priced a round 27% over the held-out runs'). The cost terms it sets,
    and what it measured."""
    scrape = lambda: client.settled(lambda: client.try_scrape(server.url))
    before = scrape()
    low, high = ACCEPT_CHARS
    key = time.monotonic_ns()
    counted: list[tuple[int, int] | None] = []
    start = time.monotonic()
    for i in range(probes):
        if len(counted) >= ACCEPT_MIN and time.monotonic() - start > ACCEPT_BUDGET_S:
            break
        chars = low + (high - low) * (i * STRIDE % probes) // max(probes - 1, 1)
        got = server.collect(server.body(text_prompt(chars, f"books:{key}:{i}"), ACCEPT_TOKENS, True))
        counted.append(_rounds(got))
    after = scrape()
    seen = [c for c in counted if c is not None]
    costs: dict = {}
    said = []
    if seen:
        tokens, rounds = sum(t for t, _ in seen), sum(r for _, r in seen)
        p = fit.acceptance_from_tokens(tokens / rounds, k)
        costs["accept_prob"] = round(p, 4)
        said.append(f"accept_prob = {p:.4f}: {tokens / rounds:.3f} tokens a round over {rounds} rounds of "
                    f"{len(seen)} lone requests ({low}-{high}-character prompts, {ACCEPT_TOKENS} tokens each), "
                    "as the server counted them")
    else:
        said.append("accept_prob: the responses counted no rounds (no timings.draft_rounds); the timing fit's is kept")
    delta = books.tick_delta(before, after) if before and after else None
    if delta is not None and calibration:  # the calibration's passes too: its rounds spread over its minute
        ticks, busy = delta
        for key, (n, ms) in _ticks_of(calibration).items():
            cell = ticks.setdefault(key, [0.0, 0.0])
            cell[0], cell[1] = cell[0] + n, cell[1] + ms
        delta = ticks, busy + calibration["busy_ms"]
    rounds_booked = [v for (kind, rows), v in (delta[0] if delta else {}).items() if kind == "round" and rows == 1]
    if rounds_booked:
        n, ms = rounds_booked[0]
        extra = books.overhead_ms(*delta)
        price = ms / n + extra
        costs["round_ms"] = [[k, round(price, 4)]]
        said.append(f"round_ms {price:.3f}: {n:g} round ticks of {ms / n:.3f} ms (the server's books over the "
                    f"calibration's passes and these) and {extra:.3f} ms a tick of the worker's time outside "
                    "model calls")
    else:
        said.append("round_ms: the server booked no round ticks of one row (no coopsched_tick_seconds_total, or a "
                    "burst's rounds sharing one tick); the timing fit's is kept")
    return costs, said


@contextlib.contextmanager
def _decoding(server: Server, key: str):
    """Classic streams of BESIDE_TOKENS decoding one after another while the block runs (the last one
    finishes after it): prompts sent to an idle engine priced their admit ticks 28-45% over the same
    prompts arriving beside a decode row in one of two passes, 2-18% in the other."""
    done = threading.Event()

    def stream() -> None:
        for i in itertools.count():
            if done.is_set():
                return
            server.collect(server.body(text_prompt(16, f"{key}:beside:{i}"), BESIDE_TOKENS, False))

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    time.sleep(BESIDE_START_S)
    try:
        yield
    finally:
        done.set()
        thread.join()


def _first_tick(server: Server, chars: int, speculative: bool, key: str) -> tuple[int, float, float] | None:
    """A lone one-token request: (its prompt's tokens, the wall time of the one tick that served it,
    its TTFT at the client), or None when the books do not show exactly one such tick. Its tick is
    booked before its token is sent, so the scrape after the response holds it."""
    kind = "slice0" if speculative else "admit"
    before = client.try_scrape(server.url)
    got = server.collect(server.body(text_prompt(chars, key), 1, speculative))
    after = client.try_scrape(server.url)
    delta = books.tick_delta(before, after) if before and after else None
    cells = [v for (k, _), v in (delta[0] if delta else {}).items() if k == kind]
    times, _ = arrivals_ms(got)
    if len(cells) != 1 or cells[0][0] != 1 or not times:
        return None
    return int((got.usage or {}).get("prompt_tokens") or chars), cells[0][1], times[0]


def prefill_books(server: Server, speculates: bool) -> tuple[dict, dict, list[str]]:
    """The prefill line from the admit ticks of one-token requests at PREFILL_CHARS sent beside a
    decoding stream (and slice 0's draft share from their speculative twins), each tick with its
    share of the worker's time outside model calls; and `frontend_ms`, what the TTFTs of the same
    prompts sent to an idle engine took beyond their ticks (the HTTP layer, which the timing fit's
    line charged to the engine). (costs, params, what it measured)"""
    key = time.monotonic_ns()
    ticks: dict[bool, list[tuple[int, float, float]]] = {False: [], True: []}
    lone = [got for chars in PREFILL_CHARS if (got := _first_tick(server, chars, False, f"lone:{key}:{chars}"))]
    # a busy engine, as a workload's prompts find it; its books never settle while the stream
    # decodes, so they are read as they stand (a settled read waited out its 3 s timeout)
    with _decoding(server, f"prefill-books:{key}"):
        before = client.try_scrape(server.url)
        for rep, chars in itertools.product(range(PREFILL_REPEATS), PREFILL_CHARS):
            for speculative in (False, True) if speculates else (False,):
                got = _first_tick(server, chars, speculative, f"prefill-books:{key}:{rep}:{chars}:{speculative}")
                if got is not None:
                    ticks[speculative].append(got)
        after = client.try_scrape(server.url)
    delta = books.tick_delta(before, after) if before and after else None
    if delta is None or len(ticks[False]) < 2:
        return {}, {}, ["prefill: the server books no admit ticks (coopsched_tick_seconds_total); the timing fit's "
                        "is kept"]
    extra = books.overhead_ms(*delta)
    line = fit.LinearFit.of([n for n, _, _ in ticks[False]], [ms + extra for _, ms, _ in ticks[False]], relative=True)
    frontend = max(float(np.median([ttft - ms - extra for _, ms, ttft in lone])), 0.0) if lone else 0.0
    costs: dict = {"prefill_fixed_ms": round(max(line.fixed, 0.0), 4),
                   "prefill_per_token_ms": round(max(line.slope, 0.0), 5)}
    said = [f"prefill {costs['prefill_fixed_ms']:.3f} + {costs['prefill_per_token_ms']:.4f} ms a token: "
            f"{len(ticks[False])} admit ticks of requests beside a decoding stream "
            f"({PREFILL_CHARS[0]}-{PREFILL_CHARS[-1]} characters), {extra:.3f} ms a tick of the worker's time "
            "outside model calls included",
            f"frontend_ms {frontend:.3f}: the TTFTs of {len(lone)} lone requests (an idle engine: nothing to wait "
            "behind) beyond their ticks (median), the HTTP layer's part"]
    if ticks[True]:  # slice 0 prefills both models: the drafter's share
        draft = fit.draft_share(line, [(n, ms + extra) for n, ms, _ in ticks[True]])
        costs["draft_prefill_per_token_ms"] = round(max(draft, 0.0), 5)
        said.append(f"draft_prefill_per_token_ms {costs['draft_prefill_per_token_ms']:.4f}: {len(ticks[True])} "
                    "slice 0 ticks beyond the prefill line")
    return costs, {"frontend_ms": round(frontend, 3)}, said


def _ticks_of(calibration: dict) -> dict[tuple[str, int], list[float]]:
    """{(kind, rows): [ticks, ms]} of the calibration's books (`fit.server_books`, keyed "kind/rows")."""
    out = {}
    for name, (n, ms) in calibration["ticks"].items():
        kind, rows = name.rsplit("/", 1)
        out[(kind, int(rows))] = [float(n), float(ms)]
    return out


def decode_books(calibration: dict | None) -> tuple[list[list[float]] | None, str]:
    """decode_ms per batch size from the decode ticks the calibration's passes booked (streams of a
    batch finish one by one, so every size up to it gets ticks), each with its share of the worker's
    time outside model calls; sizes with fewer than MIN_DECODE_TICKS are left out, the rest made
    non-decreasing (fit.monotone, weighted by ticks). None and why when there are no books."""
    if not calibration:
        return None, "decode_ms: the server books no ticks; the timing fit's is kept"
    ticks = _ticks_of(calibration)
    extra = books.overhead_ms(ticks, calibration["busy_ms"])
    sizes = sorted((rows, n, ms) for (kind, rows), (n, ms) in ticks.items()
                   if kind == "decode" and n >= MIN_DECODE_TICKS)
    if not sizes:
        return None, (f"decode_ms: fewer than {MIN_DECODE_TICKS} decode ticks at every batch size; the timing "
                      "fit's is kept")
    prices = fit.monotone([ms / n + extra for _, n, ms in sizes], [n for _, n, _ in sizes])
    points = [[rows, round(price, 4)] for (rows, _, _), price in zip(sizes, prices)]
    return points, ("decode_ms " + ", ".join(f"B={b} {ms:.3f}" for b, ms in points) + ": the calibration's decode "
                    f"ticks ({sum(n for _, n, _ in sizes):g}, the server's books) and {extra:.3f} ms a tick of "
                    "the worker's time outside model calls")


def fit_coopsched(server: Server, profile: dict, fitted: dict, say: Say) -> Fitted:
    """coopsched's scheduler needs no params but its HTTP layer's (its knobs come from /health):
    `frontend_ms`, and `frontend_stall_ms`, the engine's core each arrival's HTTP work takes (the
    server pinned to one core: at an MLX server's knee the event loop took about 18% of the engine's
    samples, a quarter of it handling new requests). The prefill, the decode steps and a speculating
    server's acceptance and round are re-read from its books (`fit_params`' form: params, evidence, costs)."""
    speculates = bool(fitted.get("speculates"))
    costs, params, said = prefill_books(server, speculates)
    decode, line = decode_books(fitted.get("server_books"))
    said.append(line)
    if decode:
        costs["decode_ms"] = decode
    if speculates:
        k = int(profile.get("verify_ms", [[1, 0.0]])[-1][0])
        more, lines = round_books(server, k, fitted.get("server_books"))
        costs.update(more)
        said += lines
    if "round_ms" in costs:  # the verify of K positions is what a round costs beyond its K - 1 drafts
        draft = float(profile.get("draft_per_token_ms") or 0.0)
        one = (decode or profile["decode_ms"])[0][1]  # a verify of one position is a decode step
        costs["verify_ms"] = [[1, one], [k, round(max(costs["round_ms"][0][1] - draft * (k - 1), 0.0), 4)]]
    # the arrivals are classic one-token requests: each is an admit tick the twin prices off its prefill line
    params["frontend_stall_ms"], line = stall_probe(server, CostModel(**{**profile, **costs}), False,
                                                    STALL_ARRIVALS, STALL_REPEATS)
    said.append(line)
    for line in said:
        say(f"coopsched: {line}")
    return params, {"says": said}, costs
