"""`coopsched calibrate --target URL`: a mock cost profile of any OpenAI-compatible streaming server,
from the timing of its tokens alone (the shared live client reads the streams).

- prefill: TTFT of lone requests at several prompt lengths, fitted fixed + per token (classic, and
  speculative for the drafter's share);
- decode: N concurrent classic requests (`speculative: false` where the server honours it) at N = 1,
  2, 4, 8: the token gaps while all N decode;
- rounds: lone speculative requests, their arrivals grouped into rounds (harness/calibrate/fit.py):
  the gap between rounds (one `round_ms` term: timing cannot split draft from verify) and the tokens
  per round, which give the drafter's acceptance;
- a classic request beside a speculative one: in fused mode (the server's /health says so) its gaps
  are fused steps, which price the draft inside a round; in slice mode, what they cost beyond a
  decode and a round is the switch between the paths (kept only when it stands out of the noise).
Every term's spread is fitted as quantiles (its jitter), so p99s carry over.
"""

from __future__ import annotations

import itertools
import random
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from harness.calibrate import books, fit
from harness.calibrate.search import GiveUp
from harness.calibrate.ticks import draft_from_fused
from harness.live import client

PREFILL_LENGTHS = (16, 64, 256, 1024)
DECODE_BATCHES = (1, 2, 4, 8)
DECODE_TOKENS = 48
ROUND_TOKENS = 128
MIX_CLASSIC_TOKENS, MIX_SPEC_TOKENS, MIX_SPEC_DELAY_MS = 96, 64, 20.0
MIN_SWITCH_SE = 2.0
# Below this many tokens per step, with no draft counts from the server, steps are decode: late
# deliveries pair up some decode tokens (1.1 per step seen on a loaded machine); a drafter accepting
# under ~0.2 per draft cannot be told from no drafter by timing alone
MIN_TOKENS_PER_ROUND = 1.25
TIMEOUT_S = 300.0


# this process's probes: a server's prefix cache, warm from an earlier calibration, answers none of them
SALT = secrets.token_hex(8)


def text_prompt(num_chars: int, key: object = 0) -> str:
    """Seeded printable ASCII (one token per character on a byte-level tokenizer, fewer on a BPE).
    Every request gets its own key, and every calibration its own SALT: a server with a prefix cache
    (mlx_lm.server, vLLM, llama.cpp) would answer a prompt it has seen, or one that starts like it,
    without prefilling it."""
    rng = random.Random(f"calibrate-target:{SALT}:{key}")
    return "".join(chr(rng.randrange(32, 127)) for _ in range(num_chars))


# a drafter's acceptance over lone requests like served ones: prompts of ACCEPT_CHARS characters evenly
# spread, ACCEPT_TOKENS each (the step probes' 16-character prompts drafted shorter and were accepted
# less on vLLM with ngram: 3.02 tokens a proposal at 0.714, against 3.28 at 0.818 here and 3.30 at
# 0.805 on the held-out text, 2026-12-07)
ACCEPT_PROBES, ACCEPT_CHARS, ACCEPT_TOKENS = 64, (24, 192), 48


def spread_prompts(tag: str, probes: int = ACCEPT_PROBES, chars: tuple[int, int] = ACCEPT_CHARS) -> list[str]:
    """`probes` prompts, each its own, of `chars` characters evenly spread from the low to the high."""
    low, high = chars
    key = time.monotonic_ns()
    return [text_prompt(low + (high - low) * i // max(probes - 1, 1), f"{tag}:{key}:{i}") for i in range(probes)]


@dataclass
class Server:
    """The server under calibration and how to talk to it."""
    url: str
    health: dict = field(default_factory=dict)
    model: str | None = None
    extensions: bool = True   # coopsched's `speculative` and `return_token_ids`, vLLM's `ignore_eos`
    context_tokens: int | None = None
    context_source: str = "the server reported no context size"

    @classmethod
    def connect(cls, url: str, extensions: bool = True) -> Server:
        client.split_url(url)
        url = url if "://" in url else f"http://{url}"
        health = client.get_json(url, "/health") or {}
        models = (client.get_json(url, "/v1/models") or {}).get("data") or []
        listed = models[0] if models and isinstance(models[0], dict) else {}
        context, source = reported_context(health, listed, lambda: client.get_json(url, "/props"))
        return cls(url, health, listed.get("id"), extensions, context, source)

    @property
    def mode(self) -> str | None:
        return self.health.get("mode")

    def body(self, prompt: str, max_tokens: int, speculative: bool) -> dict:
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
                "stream_options": {"include_usage": True}}
        if self.model:
            body["model"] = self.model
        if self.extensions:
            body.update(speculative=speculative, return_token_ids=True, ignore_eos=True)
        return body

    def collect(self, body: dict, **stream) -> client.Collected:
        """One whole stream (`stream`: client.collect's `into` and `opened`); a failure raises."""
        got = client.collect(self.url, body, timeout_s=TIMEOUT_S, **stream)
        if got.status == 400 and self.extensions:  # a strict server refuses the extensions: go plain
            self.extensions = False
            plain = {k: v for k, v in body.items() if k not in ("speculative", "return_token_ids", "ignore_eos")}
            got = client.collect(self.url, plain, timeout_s=TIMEOUT_S, **stream)
        if got.error:
            raise RuntimeError(f"{self.url}: a calibration request failed: {got.error}")
        return got

    def together(self, bodies: Sequence[dict], offsets_ms: Sequence[float] | None = None,
                 give_up: GiveUp | None = None) -> list[client.Collected]:
        """Each body streamed from its own thread, sent `offsets_ms` after a common start. With
        `give_up` (a capacity rung), a watcher stops the run once it is hopeless: requests not yet
        sent are not sent and open streams are cut (the server cancels them); those come back
        `abandoned`, and give_up records how many had been sent."""
        offsets = list(offsets_ms or [0.0] * len(bodies))
        outs = [client.Collected(0) for _ in bodies]  # filled as they stream: the watcher reads them
        errors: list[BaseException | None] = [None] * len(bodies)
        origin = time.perf_counter_ns() + 2_000_000  # 2 ms for the threads to start
        stop, lock, conns = threading.Event(), threading.Lock(), []

        def opened(conn) -> None:
            with lock:
                conns.append(conn)
                if stop.is_set():
                    client.hang_up(conn)

        def send(i: int) -> None:
            delay = (origin - time.perf_counter_ns()) / 1e9 + offsets[i] / 1e3
            if stop.wait(max(delay, 0.0)):  # given up before its send
                outs[i].abandoned = True
                return
            try:
                self.collect(bodies[i], into=outs[i], opened=opened if give_up else None)
            except BaseException as exc:  # re-raised on the calling thread, unless the watcher cut it
                outs[i].abandoned = stop.is_set()
                errors[i] = None if outs[i].abandoned else exc

        threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(len(bodies))]
        for thread in threads:
            thread.start()
        if give_up is not None:
            watch(give_up, outs, stop, lock, conns, threads)
        for thread in threads:
            thread.join(TIMEOUT_S)
        for exc in errors:
            if exc is not None:
                raise exc
        return outs


WATCH_S = 0.05  # how often a capacity rung's watcher looks at the streams


def watch(give_up: GiveUp, outs: Sequence[client.Collected], stop: threading.Event, lock: threading.Lock,
          conns: list, threads: Sequence[threading.Thread]) -> None:
    """Until the threads are done: every WATCH_S, each sent request's TTFT (or its wait so far); once
    `give_up` calls it hopeless, stop sending and cut every open stream."""
    while any(t.is_alive() for t in threads):
        now = time.perf_counter_ns()
        waited = [((o.first_token_ns or now) - o.sent_ns) / 1e6 for o in outs if o.sent_ns]
        if give_up.hopeless(waited):
            with lock:
                stop.set()
                give_up.gave_up_after = len(waited)
                for conn in conns:
                    client.hang_up(conn)
            return
        time.sleep(WATCH_S)


def reported_context(health: dict, model: dict, props: Callable[[], dict | None]) -> tuple[int | None, str]:
    """(tokens a request may use, where that came from): coopsched's /health `context_tokens`,
    llama.cpp's /v1/models `meta.n_ctx` (per slot), vLLM's `max_model_len`, or llama.cpp's /props
    `default_generation_settings.n_ctx`; (None, what was asked) when none says."""
    meta = model.get("meta") if isinstance(model.get("meta"), dict) else {}
    for value, where in ((health.get("context_tokens"), "/health context_tokens"),
                         (meta.get("n_ctx"), "/v1/models meta.n_ctx"),
                         (model.get("max_model_len"), "/v1/models max_model_len")):
        if isinstance(value, int) and value > 0:
            return value, f"{where} = {value}"
    settings = (props() or {}).get("default_generation_settings") or {}
    if isinstance(settings.get("n_ctx"), int) and settings["n_ctx"] > 0:
        return settings["n_ctx"], f"/props default_generation_settings.n_ctx = {settings['n_ctx']}"
    return None, ("the server reported no context size (no /health context_tokens, /v1/models meta.n_ctx or "
                  "max_model_len, /props n_ctx)")


def arrivals_ms(got: client.Collected, origin_ns: int | None = None) -> tuple[list[float], list[int]]:
    """(time in ms after origin, tokens) of each arrival that carried tokens."""
    origin = got.sent_ns if origin_ns is None else origin_ns
    pairs = [((a.time_ns - origin) / 1e6, n) for a, n in zip(got.arrivals, got.counts) if n > 0]
    return [t for t, _ in pairs], [n for _, n in pairs]


def reported_drafts(got: client.Collected) -> tuple[int, int] | None:
    """(draft tokens, accepted) the server counted for this request (llama.cpp's `timings`), or None."""
    timings = got.timings
    if timings is None or "draft_n" not in timings:
        return (0, 0) if timings is not None and "predicted_n" in timings else None
    return int(timings.get("draft_n") or 0), int(timings.get("draft_n_accepted") or 0)


def served_speculatively(got: client.Collected) -> bool | None:
    extension = next((a.event["coopsched"] for a in reversed(got.arrivals) if a.event.get("coopsched")), None)
    return None if extension is None else extension.get("served_speculatively")


@dataclass
class Samples:
    ttft: dict[bool, list[tuple[int, float]]] = field(default_factory=lambda: {False: [], True: []})
    decode: dict[int, list[float]] = field(default_factory=dict)   # streams decoding together -> per-token gaps
    round_gaps: list[float] = field(default_factory=list)
    round_tokens: list[int] = field(default_factory=list)
    mix_gaps: list[float] = field(default_factory=list)             # classic gaps while a spec request runs
    classic_grouped: int = 0                                         # classic streams that arrived in rounds
    spec_served_classic: int = 0                                     # speculative asks served classically
    spec_lumps: int = 0              # speculative streams in fewer than 3 groups (one lump): no rounds to time
    spec_single: int = 0             # speculative streams whose every group carried one token
    drafts: list[tuple[int, int]] | None = None   # (draft tokens, accepted) the server counted per round pass
    drafted_spans: list[tuple[float, float]] = field(default_factory=list)  # (ms after token 1, rounds drafted)
    books: tuple[dict, dict] | None = None  # the server's /metrics either side of every pass (its step books)


def arrived_in_rounds(groups: Sequence[fit.Group]) -> bool:
    """A stream's groups (first and last left out) say rounds when at least a fifth of them (and two)
    carry several tokens: a server that speculates every request sends most rounds as one group even
    at low acceptance, while one late event on a busy client bunches a pair now and then."""
    return sum(g.num_tokens > 1 for g in groups) >= max(2, len(groups) / 5)


class TargetCalibration:
    def __init__(self, server: Server, block_size: int | None = None, max_batch: int = 8) -> None:
        self.server = server
        self.block_size = block_size or int(server.health.get("block_size") or 4)
        self.batches = [b for b in DECODE_BATCHES if b <= max_batch] or [1]
        context = server.context_tokens  # unknown: every length is tried, and a refusal names it
        self.lengths = [n for n in PREFILL_LENGTHS if context is None or n + 8 <= context] or [8]
        self.samples = Samples()

    def warm_up(self) -> None:
        for speculative in (False, True):
            self.server.collect(self.server.body(text_prompt(16, f"warm:{speculative}"), 4, speculative))

    def prefill_pass(self, rep: int) -> None:
        for length in self.lengths:
            for speculative in (False, True):
                prompt = text_prompt(length, f"prefill:{rep}:{length}:{speculative}")
                got = self.server.collect(self.server.body(prompt, 2, speculative))
                times, _ = arrivals_ms(got)
                prompt_tokens = (got.usage or {}).get("prompt_tokens") or length
                if times:
                    self.samples.ttft[speculative].append((int(prompt_tokens), times[0]))

    def decode_pass(self, rep: int) -> None:
        for b in self.batches:
            prompts = [text_prompt(16, f"decode:{rep}:{b}:{i}") for i in range(b)]
            outs = self.server.together([self.server.body(prompt, DECODE_TOKENS, False) for prompt in prompts])
            origin = min(o.sent_ns for o in outs)
            streams = [arrivals_ms(o, origin) for o in outs if o.arrivals]
            spans = [(times[0], times[-1]) for times, _ in streams if times]
            for times, counts in streams:
                for (a, b_), n in zip(itertools.pairwise(times), counts[1:]):
                    if any(a < first <= b_ for first, _ in spans):  # another stream's prefill is in this gap
                        continue
                    # the batch: the streams decoding across the whole gap (a server may admit in waves)
                    active = sum(first <= a and b_ <= last for first, last in spans)
                    self.samples.decode.setdefault(active, []).append((b_ - a) / n)
                if arrived_in_rounds(fit.group_arrivals(times, counts)[1:-1]):
                    self.samples.classic_grouped += 1

    def round_pass(self, rep: int) -> None:
        got = self.server.collect(self.server.body(text_prompt(32, f"rounds:{rep}"), ROUND_TOKENS, True))
        drafts = reported_drafts(got)
        if drafts is not None:
            self.samples.drafts = [*(self.samples.drafts or []), drafts]
            times, _ = arrivals_ms(got)
            if drafts[0] and len(times) > 1:  # the stream after its first token, and the rounds it took
                self.samples.drafted_spans.append((times[-1] - times[0], drafts[0] / (self.block_size - 1)))
        if served_speculatively(got) is False:
            self.samples.spec_served_classic += 1
            return
        groups = fit.group_arrivals(*arrivals_ms(got))
        if len(groups) < 3:
            self.samples.spec_lumps += 1
            return
        rounds = fit.rounds_of(groups)
        if all(n == 1 for n in rounds.tokens):  # one token per step: decode, or a draft never accepted
            self.samples.spec_single += 1
        self.samples.round_gaps += rounds.gaps_ms
        self.samples.round_tokens += rounds.tokens

    def mix_pass(self, rep: int) -> None:
        classic = self.server.body(text_prompt(16, f"mix:{rep}:classic"), MIX_CLASSIC_TOKENS, False)
        spec = self.server.body(text_prompt(32, f"mix:{rep}:spec"), MIX_SPEC_TOKENS, True)
        outs = self.server.together([classic, spec], [0.0, MIX_SPEC_DELAY_MS])
        origin = min(o.sent_ns for o in outs)
        (c_times, c_counts), (s_times, _) = (arrivals_ms(o, origin) for o in outs)
        if len(s_times) < 3:
            return
        first, last = s_times[1], s_times[-1]  # the speculative request is past its slice 0 ...
        for (a, b), n in zip(itertools.pairwise(c_times), c_counts[1:]):
            if a >= first and b <= last:       # ... and still running
                self.samples.mix_gaps.append((b - a) / n)

    PHASES = (("prefill", "prefill_pass"), ("decode", "decode_pass"), ("rounds", "round_pass"), ("mix", "mix_pass"))

    def run(self, repeats: int, advance: Callable[[str], None] | None = None) -> None:
        """Every phase `repeats` times, round-robin, so load elsewhere spreads over all of them."""
        self.warm_up()
        scrape = lambda: client.settled(lambda: client.try_scrape(self.server.url))
        before = scrape()
        for rep in range(repeats):
            for name, method in self.PHASES:
                getattr(self, method)(rep)
                if advance:
                    advance(f"{name} {rep + 1}/{repeats}")
        after = scrape() if before else None
        self.samples.books = (before, after) if before and after else None

    # -- the profile -------------------------------------------------------------------------
    def no_rounds(self) -> str | None:
        """Why no speculative round can be fitted, naming what the server did and reported; None when
        rounds were seen (more than one token in some round, or drafts the server counted)."""
        s = self.samples
        drafted = sum(d for d, _ in s.drafts) if s.drafts is not None else None
        if drafted or (drafted is None and s.round_tokens and np.mean(s.round_tokens) >= MIN_TOKENS_PER_ROUND):
            return None
        seen = []
        if s.spec_served_classic:
            seen.append(f"{s.spec_served_classic} speculative request(s) came back `served_speculatively: false`")
        if s.spec_lumps:
            seen.append(f"{s.spec_lumps} streamed in one lump (fewer than 3 groups of arrivals)")
        if s.spec_single:
            seen.append(f"{s.spec_single} arrived one token per step, as classic decode does")
        if s.round_tokens and not s.spec_single:
            mean = float(np.mean(s.round_tokens))
            seen.append(f"their arrivals came {mean:.3f} tokens at a time" + (
                f", under the {MIN_TOKENS_PER_ROUND} that tells rounds from decode steps delivered together"
                if mean < MIN_TOKENS_PER_ROUND else ", which is how its stream delivers them, not rounds"))
        told = ("its responses' `timings` counted no draft tokens (no `draft_n`)" if drafted == 0 else
                "it reports no draft counts (no `timings`)")
        return "no speculative rounds were seen: " + "; ".join(
            [*(f"of the speculative requests, {x}" for x in seen[:1]), *seen[1:], told])

    def profile(self) -> dict:
        """CostModel fields and `fit`; the speculative terms only when rounds were seen (else
        `fit.unfitted` names each missing term and why, and the profile prices no speculation)."""
        s = self.samples
        if not s.decode or not s.ttft[False]:
            raise RuntimeError(f"{self.server.url}: no classic decode gaps or first tokens were timed: every "
                               "calibration request streamed at most one token")
        batches = sorted(b for b in s.decode if s.decode[b])
        levels, decode_ratios = decode_levels({b: s.decode[b] for b in batches})
        decode = fit.monotone([levels[b] for b in batches], [len(s.decode[b]) for b in batches])
        decode_points = [[b, round(v, 4)] for b, v in zip(batches, decode)]
        prefill = fit.LinearFit.of(*zip(*s.ttft[False]), relative=True)
        quantiles = {
            "prefill": fit.jitter_quantiles([y / prefill(x) for x, y in s.ttft[False] if prefill(x) > 0]),
            "decode": fit.jitter_quantiles(decode_ratios),
        }
        fitted = {"prefill": _line(prefill), "decode": {b: fit.summary(s.decode[b]) for b in batches},
                  "server_books": _books_of(s.books),
                  "classic_streams_in_rounds": s.classic_grouped,
                  "speculative_served_classically": s.spec_served_classic,
                  "server_drafts": _server_drafts(s.drafts)}
        why = self.no_rounds()
        if why is not None:
            unfitted = {term: why for term in UNFITTED_WITHOUT_ROUNDS}
            terms = fit.profile_terms(prefill, 0.0, decode_points, 0.0, 1, decode_points[0][1], None, "ragged",
                                      0.0, quantiles, 0.0)
            return {**terms, "verify_ms": [[1, decode_points[0][1]]], "accept_prob": None,
                    "fit": {**fitted, "unfitted": unfitted, "speculates": False}}
        return self._speculative(prefill, decode_points, quantiles, fitted)

    def _speculative(self, prefill: fit.LinearFit, decode_points: list, quantiles: dict, fitted: dict) -> dict:
        s, k = self.samples, self.block_size
        decode_at = dict(decode_points)
        slice0 = fit.LinearFit.of(*zip(*s.ttft[True]), relative=True) if s.ttft[True] else prefill
        draft_prefill = fit.draft_share(prefill, s.ttft[True])
        round_levels, round_ratios = fit.levels({k: s.round_gaps})
        round_ms = timed_round_ms = round_levels[k]
        mean_tokens = float(np.mean(s.round_tokens)) if s.round_tokens else 0.0
        accept = timed_accept = fit.acceptance_from_tokens(mean_tokens, k)
        counted = _server_drafts(s.drafts)
        if counted and counted["acceptance"] is not None and s.drafted_spans and self.server.mode is None:
            # a server that does not describe itself (llama.cpp) may deliver several rounds together:
            # its own counts win over timing there (K - 1 drafts per round, the rounds' time the
            # stream's after its first token); one that names its mode stamps each round, so timing
            # sees them, and its `timings` may count drafts as upstream does (K per round)
            accept = fit.acceptance_from_tokens(1 + counted["acceptance"] * (k - 1), k)
            round_ms = sum(t for t, _ in s.drafted_spans) / sum(n for _, n in s.drafted_spans)
        mode = self.server.mode
        draft = switch = 0.0
        mix = fit.summary(s.mix_gaps)
        switch_raw = switch_se = None
        if mode == "fused" and s.mix_gaps:
            draft = draft_from_fused({1: mix["mean"]}, decode_points, k, "ragged")
        elif mode == "slice" and len(s.mix_gaps) > 1:
            switch_raw = (mix["mean"] - decode_at[decode_points[0][0]] - round_ms) / 2
            switch_se = float(np.std(s.mix_gaps, ddof=1) / np.sqrt(len(s.mix_gaps)) / 2)
            switch = switch_raw if switch_raw > MIN_SWITCH_SE * switch_se else 0.0
        quantiles = {**quantiles, "verify": fit.jitter_quantiles(round_ratios)}
        if mode == "fused" and s.mix_gaps:
            quantiles["fused"] = fit.jitter_quantiles([g / mix["mean"] for g in s.mix_gaps])
        return {
            **fit.profile_terms(prefill, draft_prefill, decode_points, draft, k, round_ms,
                                [[k, round(round_ms, 4)]], "ragged", switch, quantiles, accept),
            "fit": {**fitted, "slice0": _line(slice0),
                    "rounds": {**fit.summary(s.round_gaps), "tokens_per_round": mean_tokens,
                               "num_rounds": len(s.round_tokens), "timed_round_ms": round(timed_round_ms, 4),
                               "timed_accept_prob": round(timed_accept, 4),
                               "from": "the server's draft counts" if accept != timed_accept else "timing"},
                    "mix": mix, "switch_ms_measured": switch_raw, "switch_ms_se": switch_se,
                    "unfitted": {}, "speculates": True},
        }


BUNCHED = 5.0  # a median gap this far under the mean: the stream delivers its tokens in bunches


def decode_levels(groups: dict[int, list[float]]) -> tuple[dict, list[float]]:
    """fit.levels, unless the stream delivers tokens in bunches (llama-server on one core: gaps of
    0.02 ms between bursts of 50 ms): a median then says nothing, and each batch's level is its mean.
    One bunched batch is enough: mlx_lm.server on one core bunched B = 1, 3 and 4 but not B = 2 and 6,
    and their medians of 0.01 ms scaled the pooled ratio to 33, pricing B = 2 at 95 ms (2.6 measured)."""
    if not any(xs and float(np.median(xs)) * BUNCHED < float(np.mean(xs)) for xs in groups.values()):
        return fit.levels(groups)
    means = {b: float(np.mean(xs)) for b, xs in groups.items()}
    return means, [x / means[b] for b, xs in groups.items() for x in xs if means[b] > 0]


# the profile terms only speculative rounds price
UNFITTED_WITHOUT_ROUNDS = ("round_ms", "verify_ms", "draft_per_token_ms", "draft_prefill_per_token_ms",
                           "accept_prob", "switch_ms")


def _server_drafts(drafts: list[tuple[int, int]] | None) -> dict | None:
    """What the server itself counted over the lone speculative requests (llama.cpp's `timings`)."""
    if drafts is None:
        return None
    drafted, accepted = sum(d for d, _ in drafts), sum(a for _, a in drafts)
    return {"draft_tokens": drafted, "accepted_tokens": accepted, "requests": len(drafts),
            "acceptance": round(accepted / drafted, 4) if drafted else None}


def _books_of(scrapes: tuple[dict, dict] | None) -> dict | None:
    """The step books the server kept over the calibration's passes ({"kind/rows": [ticks, ms]} and
    the worker's busy ms), or None from a server that keeps none (harness/calibrate/books.py)."""
    delta = books.tick_delta(*scrapes) if scrapes else None
    if delta is None:
        return None
    ticks, busy = delta
    return {"ticks": {f"{kind}/{rows}": [n, round(ms, 3)] for (kind, rows), (n, ms) in sorted(ticks.items())},
            "busy_ms": round(busy, 3)}


def _line(line: fit.LinearFit) -> dict:
    return {"fixed_ms": line.fixed, "per_token_ms": line.slope,
            "points": [[x, y, r] for x, y, r in zip(line.xs, line.ys, line.residuals)]}


# -- the twin check: the fixed workload over HTTP ------------------------------------------------
def measure_workload(server: Server, specs, seed: int, give_up: GiveUp | None = None) -> list[dict]:
    """One run of the workload's requests at their arrival offsets; per request what twin.pooled reads.
    With `give_up`, a hopeless run stops early (Server.together): a request it never sent is a row
    with no token at its planned offset, one it cut keeps the tokens it had."""
    from harness.calibrate.twin import served

    bodies = [server.body(bytes(s.prompt_tokens(seed)).decode("utf-8", errors="replace"), s.max_tokens,
                          s.speculative) for s in specs]
    outs = server.together(bodies, [s.arrival_ms for s in specs], give_up)
    origin = min(o.sent_ns for o in outs if o.sent_ns)
    first = min(s.arrival_ms for s in specs)
    rows = []
    for spec, got in zip(specs, outs):
        if not got.sent_ns:
            rows.append(served(spec.arrival_ms - first, [], spec.speculative))
            continue
        times, counts = arrivals_ms(got, origin)
        served_spec = served_speculatively(got)
        rows.append(served((got.sent_ns - origin) / 1e6, [t for t, n in zip(times, counts) for _ in range(n)],
                           spec.speculative if served_spec is None else served_spec))
    return rows


def twin_config_of(server: Server, mode: str | None, block_size: int):
    """The scheduler the server reports (mode, K, G, batch), for simulating it."""
    from coopsched.core import MODES
    from harness.calibrate.twin import twin_config

    health = server.health
    options = {key: int(health[key]) for key in ("grant_rounds", "backlog_cap", "max_batch_size") if key in health}
    reported = server.mode if server.mode in MODES else None
    return twin_config(mode or reported or "slice", block_size, **options)
