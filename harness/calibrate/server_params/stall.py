"""frontend_stall_ms, for a server whose HTTP layer shares the step loop's core (llama-server, `coopsched
serve`, each pinned to one): a stream alone, then with one-token arrivals spread over it; what each
arrival took of the core beyond the prompt the twin already charges for it."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

from harness.calibrate.target import Server, text_prompt
from mocks.cost import CostModel

STALL_PROMPT = 16  # characters: the stream's and the arrivals' prompts
# a stream alone and with one-token arrivals spread over it, each way this many times
STALL_TOKENS, STALL_ARRIVALS, STALL_REPEATS = 256, 8, 3


def arrival_stall(passes: Sequence[tuple[float, float, int]], join_ms: float) -> tuple[float, str]:
    """frontend_stall_ms: how much longer a stream's generation took (the server's `predicted_ms`)
    with one-token requests sent during it than alone just before, per arrival that landed before its
    last token (the median over the passes: each pass against its own lone run, as the server's work
    per arrival grows with the requests it has served), less what the twin already charges for an
    arrival (its prompt joining a step, `join_ms`): what the arrival took of the core, never under 0."""
    passes = [p for p in passes if p[2] > 0]
    if not passes:
        return 0.0, "frontend_stall_ms = 0: no stream was timed alone and with arrivals during it"
    excess = statistics.median((crossed - alone) / landed for alone, crossed, landed in passes)
    ms = round(max(excess - join_ms, 0.0), 4)
    shown = ", ".join(f"{alone:.2f} -> {crossed:.2f} with {landed}" for alone, crossed, landed in passes)
    return ms, (f"frontend_stall_ms = {ms:g}: a {STALL_TOKENS}-token stream alone, then with one-token arrivals "
                f"spread over it (server's clock: {shown} arrived before its last token, ms): {excess:.3f} ms an "
                f"arrival (median), less the {join_ms:.3f} ms the twin charges for its prompt in a step")


def stall_probe(server: Server, costs: CostModel, speculates: bool, arrivals: int = STALL_ARRIVALS,
                repeats: int = STALL_REPEATS) -> tuple[float, str]:
    """The stream alone, then with `arrivals` arrivals spread evenly over the lone run's span (a
    fixed gap outlasted a fast server's stream: on 2026-12-07 five of eight arrivals came after its
    last token and the stall read 0), `repeats` times (the same stream each time: greedy, so the
    same steps). Only the arrivals sent before the stream's last token count. An arrival's prompt is
    priced as the twin's executor prices it joining a step (a prefill forward of its tokens)."""
    key = f"stall:{time.monotonic_ns()}"
    stream = server.body(text_prompt(STALL_PROMPT, key), STALL_TOKENS, False)
    passes, prompts = [], []
    for rep in range(repeats):
        (got,) = server.together([stream])
        if not (times := got.token_times_ms(got.sent_ns)):
            continue
        gap = times[-1] / (arrivals + 1)
        bodies = [stream] + [server.body(text_prompt(STALL_PROMPT, f"{key}:{rep}:{i}"), 1, False)
                             for i in range(arrivals)]
        outs = server.together(bodies, [0.0] + [gap * (i + 1) for i in range(arrivals)])
        alone, crossed = got.timings, outs[0].timings
        last_ns = outs[0].arrivals[-1].time_ns if outs[0].arrivals else 0
        if alone and crossed:
            landed = sum(o.sent_ns < last_ns for o in outs[1:])
            passes.append((float(alone["predicted_ms"]), float(crossed["predicted_ms"]), landed))
        prompts += [int(t.get("prompt_n", 0)) for t in (o.timings for o in outs[1:]) if t]
    join = costs.prefill_batch([(round(statistics.mean(prompts)) if prompts else STALL_PROMPT, speculates)])
    return arrival_stall(passes, join)
