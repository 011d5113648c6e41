"""`coopsched serve`: what its own books say. Each response counts its request's rounds
(`timings.draft_rounds`), and /metrics books every tick's kind, rows and wall time and the worker's
busy time (harness/calibrate/books.py). Over lone speculative requests at prompts of the held-out
lengths, they give the drafter's acceptance from many prompts (three, timed, read 0.52 and 0.75 on
one MLX server minutes apart; 12 counted, three times over, agreed within 0.05 tokens a round) and a
round's price, free of how the stream delivered its tokens.
"""

from __future__ import annotations

import time

from harness.calibrate import books, fit
from harness.calibrate.target import Server, text_prompt
from harness.live import client

from .kinds import Fitted, Say

ACCEPT_PROBES, ACCEPT_CHARS, ACCEPT_TOKENS = 24, (24, 192), 64
ACCEPT_BUDGET_S, ACCEPT_MIN = 3.0, 6  # probes stop after this long, once this many have run (a slow server)
STRIDE = 7  # the i-th probe's length: step i x STRIDE (mod ACCEPT_PROBES) of the range, so a budget cut keeps the spread


def _rounds(got: client.Collected) -> tuple[int, int] | None:
    """(tokens after the first, rounds) the server counted for a request, or None."""
    timings = next((a.event["timings"] for a in reversed(got.arrivals) if isinstance(a.event.get("timings"), dict)),
                   None)
    if not timings or not timings.get("draft_rounds"):
        return None
    return int(timings["predicted_n"]) - 1, int(timings["draft_rounds"])


def round_books(server: Server, k: int, probes: int = ACCEPT_PROBES) -> tuple[dict, list[str]]:
    """accept_prob and the round's price over up to `probes` lone speculative requests (prompts of
    ACCEPT_CHARS characters spread evenly, ACCEPT_TOKENS each; ACCEPT_BUDGET_S of them at most, once
    ACCEPT_MIN ran): tokens a round from the responses' round counts; the price from the round
    ticks' own wall time plus each tick's share of the worker's time outside model calls. The cost
    terms it sets, and what it measured."""
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
    rounds_booked = [v for (kind, rows), v in (delta[0] if delta else {}).items() if kind == "round" and rows == 1]
    if rounds_booked:
        n, ms = rounds_booked[0]
        extra = books.overhead_ms(*delta)
        price = ms / n + extra
        costs["round_ms"] = [[k, round(price, 4)]]
        said.append(f"round_ms {price:.3f}: {n:g} round ticks of {ms / n:.3f} ms (the server's books) and "
                    f"{extra:.3f} ms a tick of the worker's time outside model calls")
    else:
        said.append("round_ms: the server books no ticks (no coopsched_tick_seconds_total); the timing fit's is kept")
    return costs, said


def fit_coopsched(server: Server, profile: dict, fitted: dict, say: Say) -> Fitted:
    """coopsched's scheduler needs no params (its knobs come from /health); a speculating server's
    acceptance and round are re-read from its books (`fit_params`' form: params, evidence, costs)."""
    if not fitted.get("speculates"):
        return {}, {"says": []}, {}
    k = int(profile.get("verify_ms", [[1, 0.0]])[-1][0])
    costs, said = round_books(server, k)
    if "round_ms" in costs:  # the verify of K positions is what a round costs beyond its K - 1 drafts
        draft = float(profile.get("draft_per_token_ms") or 0.0)
        costs["verify_ms"] = [[1, profile["verify_ms"][0][1]], [k, round(max(costs["round_ms"][0][1] - draft * (k - 1),
                                                                               0.0), 4)]]
    for line in said:
        say(f"coopsched: {line}")
    return {}, {"says": said}, costs
