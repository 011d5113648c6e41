"""`coopsched run NAME --target URL`: a scenario against any OpenAI-compatible server, in real time.

Each request streams from its own thread at its arrival offset; token arrival
times are raw perf_counter_ns. The checks cover every request's TTFT as well
as the classic ITL: a server that serves requests one at a time shows its
head-of-line block as the next request's TTFT, not as an ITL gap. When the
server reports its costs (coopsched serve's /health) bounds come from them;
otherwise each request first runs alone and the run together must stay within
a stated multiple of those solo figures.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from harness.live import client, stalls
from harness.live.solo import RULE as SOLO_RULE
from harness.live.solo import SOLO_RUNS, SoloLimit, ceiling_ms, solo_limit_of
from harness.run import metrics
from harness.run.bounds import REAL_TIME_ALLOWANCE
from harness.run.scenario import RequestSpec, Scenario
from harness.verdict.check import record as check
from harness.verdict.live import stall_check
from mocks import CostModel

SLACK_MS = 10.0          # real-time slack on every cost-derived bound (HTTP, thread wake-ups)
ORDER_TOLERANCE_MS = 5.0  # requests sent this close together may reach the server in either order
TIMEOUT_S = 300.0
TOGETHER_RUNS = 3  # attempts at a run together in which the requests overlap


@dataclass
class Streamed:
    """What one request's stream delivered, times in ms from the run's start."""
    spec: RequestSpec
    sent_ms: float = 0.0
    token_ids: list[int] = field(default_factory=list)
    token_times_ms: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None
    server_id: str | None = None
    served_speculatively: bool | None = None
    burst: dict | None = None
    stream: stalls.Stream | None = None   # raw arrivals and tick ends, for the stall rule
    max_event_tokens: int = 1
    end_ms: float | None = None           # when the stream ended ([DONE], an error or a cut)
    timings: dict | None = None           # llama.cpp's per-request `timings` (draft_n: tokens drafted)

    @property
    def ttft_ms(self) -> float | None:
        return self.token_times_ms[0] - self.sent_ms if self.token_times_ms else None

    @property
    def stall_ms(self) -> float:
        return max(metrics.itl(self.token_times_ms), default=0.0)

    @property
    def is_speculative(self) -> bool:
        return self.spec.speculative if self.served_speculatively is None else self.served_speculatively

    @property
    def kind(self) -> str:
        return "spec" if self.is_speculative else "classic"

    @property
    def was_speculated_against_ask(self) -> bool:
        """Sent `speculative: false`, yet the server says (extension or `timings.draft_n`) it speculated."""
        return not self.spec.speculative and bool(self.served_speculatively)

    @property
    def life_ms(self) -> tuple[float, float] | None:
        """Sent -> last token, ms from the run's start."""
        return (self.sent_ms, self.token_times_ms[-1]) if self.token_times_ms else None


@dataclass
class Solo:
    """One request's runs alone: its figures are the worst of them (harness/live/solo.py)."""
    runs: list[Streamed]

    @property
    def ttft_ms(self) -> float | None:
        return max((r.ttft_ms for r in self.runs if r.ttft_ms is not None), default=None)

    @property
    def stall_ms(self) -> float | None:
        return max((r.stall_ms for r in self.runs if r.token_times_ms), default=None)

    @property
    def token_ids(self) -> list[int]:
        return self.runs[0].token_ids

    @property
    def text(self) -> str:
        return self.runs[0].text

    @property
    def num_tokens(self) -> int:
        return min(len(r.token_times_ms) for r in self.runs)

    @property
    def max_event_tokens(self) -> int:
        return max(r.max_event_tokens for r in self.runs)

    @property
    def streams(self) -> list[stalls.Stream]:
        return [r.stream for r in self.runs if r.stream is not None]

    @property
    def life_ms(self) -> float | None:
        """The shortest run alone, sent to last token."""
        return min((r.token_times_ms[-1] - r.sent_ms for r in self.runs if r.token_times_ms), default=None)


class Target:
    def __init__(self, url: str) -> None:
        try:
            client.split_url(url)
        except ValueError:
            raise ValueError(f"--target {url!r}: want http://HOST:PORT") from None
        self.url = url if "://" in url else f"http://{url}"

    def ping(self) -> None:
        """A ValueError naming the URL when no server answers: before any request is sent or timed."""
        try:
            client.request(self.url, "GET", "/v1/models", timeout_s=5)
        except OSError as exc:
            raise ValueError(f"--target {self.url}: no server answered ({exc})") from None

    def get_json(self, path: str) -> dict | None:
        return client.get_json(self.url, path, timeout_s=10)

    def stream(self, body: dict, out: Streamed, origin_ns: int) -> None:
        """POST a streaming completion (the shared reader); each token's time is its event's arrival."""
        got = client.collect(self.url, body, timeout_s=TIMEOUT_S)
        out.sent_ms = (got.sent_ns - origin_ns) / 1e6
        out.error = got.error
        out.token_ids = got.token_ids
        out.token_times_ms = got.token_times_ms(origin_ns)
        out.end_ms = (time.perf_counter_ns() - origin_ns) / 1e6
        out.text = got.text
        out.finish_reason = got.finish_reason
        out.max_event_tokens = max(got.counts, default=1)
        out.server_id = next((a.event.get("id") for a in got.arrivals if a.event.get("id")), None)
        extension = next((a.event["coopsched"] for a in reversed(got.arrivals) if a.event.get("coopsched")), None)
        out.timings = next((a.event["timings"] for a in reversed(got.arrivals)
                            if isinstance(a.event.get("timings"), dict)), None)
        if extension:
            out.served_speculatively = extension.get("served_speculatively")
            out.burst = extension.get("burst")
        if out.served_speculatively is None and out.timings is not None and "draft_n" in out.timings:
            out.served_speculatively = (out.timings.get("draft_n") or 0) > 0  # llama.cpp's own word for it
        out.stream = stalls.Stream.of(out.spec.id, out.kind, got)


def request_body(spec: RequestSpec, seed: int, model: str | None) -> dict:
    prompt = bytes(spec.prompt_tokens(seed)).decode("utf-8", errors="replace")
    body = {"prompt": prompt, "max_tokens": spec.max_tokens, "temperature": spec.temperature,
            "stream": True, "stream_options": {"include_usage": True},
            "speculative": spec.speculative, "return_token_ids": True, "return_tick_times": True}
    if spec.temperature > 0:
        body["seed"] = seed
    if spec.stop:
        body["stop"] = list(spec.stop)
    if model:
        body["model"] = model
    return body


def run_together(target: Target, specs, seed: int, model: str | None) -> list[Streamed]:
    """Every request on its own thread, sent at its arrival offset."""
    return run_closed(target, specs, set(), 0, 0.0, seed, model)


def run_closed(target: Target, specs: Sequence, looped: set[str], concurrency: int, start_ms: float, seed: int,
               model: str | None) -> list[Streamed]:
    """The one live driver: `concurrency` users from start_ms, each streaming the next unsent looped
    request when its last one ends; the other requests go at their own arrival offsets, each on its
    own thread (no looped requests: an open loop)."""
    outs = [Streamed(spec) for spec in specs]
    unsent = deque(o for o in outs if o.spec.id in looped)
    origin = time.perf_counter_ns()

    def at(ms: float) -> None:
        delay = ms / 1e3 - (time.perf_counter_ns() - origin) / 1e9
        if delay > 0:
            time.sleep(delay)

    def user() -> None:
        at(start_ms)
        while True:
            try:
                out = unsent.popleft()  # atomic: two users never take the same request
            except IndexError:
                return
            target.stream(request_body(out.spec, seed, model), out, origin)

    def fixed(out: Streamed) -> None:
        at(out.spec.arrival_ms)
        target.stream(request_body(out.spec, seed, model), out, origin)

    threads = [threading.Thread(target=user, daemon=True) for _ in range(min(concurrency, len(unsent)))]
    threads += [threading.Thread(target=fixed, args=(o,), daemon=True) for o in outs if o.spec.id not in looped]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S * max(1, len(unsent)))
    return outs


def drive(target: Target, specs: Sequence, workload, seed: int, model: str | None) -> list[Streamed]:
    """A scenario's requests live: a closed-loop [workload] through its users, the rest at their offsets."""
    if workload is not None and workload.is_closed:
        return run_closed(target, specs, set(workload.ids()), workload.concurrency or 1, workload.start_ms,
                          seed, model)
    return run_together(target, specs, seed, model)


def warm_up(target: Target, specs, seed: int, model: str | None) -> None:
    """A few tokens of each request, alone, before anything is measured: cold paths (first forward,
    compilation, allocation) would otherwise land in the solo figures or the first gaps."""
    for spec in specs:
        run_together(target, [replace(spec, arrival_ms=0.0, max_tokens=min(spec.max_tokens, 4))], seed, model)


# -- checks -------------------------------------------------------------------------
@dataclass
class CostTerms:
    """The server's cost terms for one run (ms), with the real-time allowance."""
    decode: float                 # a decode step at the run's classic batch size
    spec_action: float            # one round, or the longest speculative slice 0
    admission: dict               # request id -> its admission (classic prefill or slice 0)
    grant_rounds: int
    backlog_cap: int
    max_batch_size: int
    block_size: int = 4

    @property
    def rule(self) -> stalls.Rule:
        return stalls.Rule(tokens_per_round=self.block_size)

    @staticmethod
    def allow(ms: float) -> float:
        return REAL_TIME_ALLOWANCE * ms + SLACK_MS


def cost_terms(outs: list[Streamed], cost: CostModel, health: dict, seed: int) -> CostTerms:
    num_classic = sum(not o.is_speculative for o in outs)
    prompt = {o.spec.id: len(o.spec.prompt_tokens(seed)) for o in outs}
    slice0 = {o.spec.id: cost.slice0(prompt[o.spec.id]) for o in outs if o.is_speculative}
    admission = {i: slice0.get(i, cost.prefill(n)) for i, n in prompt.items()}
    return CostTerms(cost.decode(max(num_classic, 1)),
                     max([cost.round(health.get("block_size", 4), 1), *slice0.values()]), admission,
                     health.get("grant_rounds", 8), health.get("backlog_cap", 2), health.get("max_batch_size", 8),
                     health.get("block_size", 4))


def _pending(outs: list[Streamed], start: float, end: float, skip: Streamed) -> list[Streamed]:
    """Requests sent by `end` that got their first token after `start`: each may put one admission
    and one speculative action (strict alternation) into that span."""
    return [p for p in outs if p is not skip and p.sent_ms <= end
            and (not p.token_times_ms or p.token_times_ms[0] > start)]


UNBOUNDED = 10**9  # a wait that legitimately holds other rows' whole replies: no run-ahead can be told apart


def ttft_check(outs: list[Streamed], terms: CostTerms) -> dict:
    """TTFT <= allowance x (own admission + decode + one spec action, + one admission and one spec action
    per request still pending at arrival, + a waiter's wait for the active grants, + a full batch's wait
    for its first finish); a TTFT over it is charged only if a stream ran ahead (harness/live/stalls.py)."""
    waits = []
    for o in outs:
        if o.ttft_ms is None:
            continue
        ahead = [p for p in _pending(outs, o.sent_ms, o.sent_ms + ORDER_TOLERANCE_MS, o)
                 if p.sent_ms < o.sent_ms + ORDER_TOLERANCE_MS]
        ms = terms.admission[o.spec.id] + terms.decode + terms.spec_action
        ms += sum(terms.admission[p.spec.id] + terms.spec_action for p in ahead)
        rounds = len(ahead)
        if o.is_speculative:
            busy = [p for p in outs if p is not o and p.is_speculative
                    and p.sent_ms <= o.sent_ms + ORDER_TOLERANCE_MS
                    and p.token_times_ms and p.token_times_ms[-1] > o.sent_ms]
            waited = terms.grant_rounds * min(len(busy), terms.backlog_cap + 1)
            ms += waited * (terms.spec_action + terms.decode)
            rounds += waited
        running = [p.token_times_ms[-1] for p in outs if p is not o and not p.is_speculative
                   and p.token_times_ms and p.token_times_ms[0] <= o.sent_ms < p.token_times_ms[-1]]
        bound = terms.allow(ms)
        if len(running) >= terms.max_batch_size:  # a full batch: wait for its first row to finish
            bound += min(running) - o.sent_ms
            rounds = UNBOUNDED
        waits.append(stalls.Wait(o.stream, 0, bound, rounds=rounds, admissions=len(ahead)))
    if not waits:
        return check("ttft", None, None, None, note="no request produced a token")
    return _charged_check("ttft", waits, outs, terms.rule,
                          f"TTFT <= 1.5 x (own admission + decode + one spec action + one admission and spec "
                          f"action per request ahead + a waiter's grant wait) + {SLACK_MS:g} ms; "
                          + "; ".join(f"{w.stream.id}: {w.ms:.1f} vs {w.limit_ms:.1f}" for w in waits))


def classic_gap_check(outs: list[Streamed], terms: CostTerms, per_gap: int) -> dict:
    """Every classic gap <= allowance x (decode + per_gap spec actions, + one admission and one spec
    action per request pending during the gap); a gap over it is charged only if a stream ran ahead."""
    waits = []
    for o in outs:
        if o.is_speculative:
            continue
        for i, (a, b) in enumerate(metrics.gap_spans(o.token_times_ms), start=1):
            inside = _pending(outs, a, b, o)
            ms = terms.decode + per_gap * terms.spec_action
            ms += sum(terms.admission[p.spec.id] + terms.spec_action for p in inside)
            waits.append(stalls.Wait(o.stream, i, terms.allow(ms), rounds=per_gap - 1 + len(inside),
                                     admissions=len(inside)))
    if not waits:
        return check("classic_itl", None, None, None, note="no classic gaps")
    return _charged_check("classic_itl", waits, outs, terms.rule,
                          f"gap <= 1.5 x (decode {terms.decode:.1f} + {per_gap} x spec action "
                          f"{terms.spec_action:.1f} + one admission and spec action per pending request) "
                          f"+ {SLACK_MS:g} ms")


def _charged_check(name: str, waits: list[stalls.Wait], outs: list[Streamed], rule: stalls.Rule, limit: str) -> dict:
    """A time check whose waits over their limit fail it only when the stall rule charges them."""
    return stall_check(name, waits, [o.stream for o in outs if o.stream is not None], rule, limit).to_json()


def burst_wall_check(outs: list[Streamed], terms: CostTerms) -> dict:
    bursts = [(o.spec.id, o.burst["burst_wall_ms"]) for o in outs if o.burst]
    if not bursts:
        return check("burst_wall", None, None, None, note="the server reports no BurstFinalized records")
    worst = max(bursts, key=lambda b: b[1])
    bound = terms.allow(1.05 * terms.spec_action)
    return check("burst_wall", worst[1] <= bound, worst[1], bound,
                 note=f"worst: {worst[0]}; the longest tick a speculative request held <= 1.5 x 1.05 x "
                      f"max(round, slice 0) + {SLACK_MS:g} ms")


def cost_checks(outs: list[Streamed], scenario: Scenario, cost: CostModel, health: dict,
                seed: int) -> list[dict]:
    """Bounds from the server's cost terms, as the virtual harness builds them, with the real-time allowance."""
    terms = cost_terms(outs, cost, health, seed)
    out = [ttft_check(outs, terms)]
    wanted = scenario.checks
    if "classic_itl" in wanted:
        apart = overlap_note(outs)
        out.append(check("classic_itl", None, None, None, note=f"skipped: {apart}") if apart else
                   classic_gap_check(outs, terms, wanted["classic_itl"].get("spec_actions_per_gap", 1)))
    if "burst_wall" in wanted:
        out.append(burst_wall_check(outs, terms))
    return out


OVERLAP_SHARE = 0.25  # two requests overlapped when they were in flight together for this share of the shorter


def overlap_note(outs: list[Streamed]) -> str | None:
    """Why the checks that compare together with alone cannot tell anything: no two requests were in
    flight together for OVERLAP_SHARE of the shorter one's life (each ran about alone again). None
    when some were."""
    lives = sorted((o.life_ms, o.spec.id) for o in outs if o.life_ms is not None)
    if len(lives) < 2:
        return None
    for ((a0, a1), _), ((b0, b1), _) in itertools.combinations(lives, 2):
        if min(a1, b1) - max(a0, b0) >= OVERLAP_SHARE * min(a1 - a0, b1 - b0):
            return None
    spans = ", ".join(f"{i} {a:.1f}-{b:.1f} ms" for (a, b), i in lives)
    return f"no two requests overlapped for {OVERLAP_SHARE:.0%} of the shorter ({spans}): together was alone again"


def solo_limits(outs: list[Streamed], solo: dict[str, Solo], figure) -> dict[str, SoloLimit]:
    """Each request's limit from its solo figure, with a ceiling from the other requests' solo runs."""
    out = {}
    for o in outs:
        alone = figure(solo[o.spec.id])
        if alone is not None:
            out[o.spec.id] = solo_limit_of(alone, ceiling_ms(s.life_ms for i, s in solo.items() if i != o.spec.id))
    return out


def solo_checks(outs: list[Streamed], solo: dict[str, Solo]) -> list[dict]:
    """Together vs alone: TTFT and every gap within the solo rule (harness/live/solo.py); a wait over it
    is charged only if a stream ran ahead in it (R: the most tokens one event carried alone; each kind's
    pace from its solo runs)."""
    streams_alone = [st for s in solo.values() for st in s.streams]
    rule = stalls.Rule(tokens_per_round=max((s.max_event_tokens for s in solo.values()), default=1),
                       pace_ms=stalls.pace_ms(streams_alone), paces=stalls.paces_by_kind(streams_alone))
    skipped = overlap_note(outs)
    out = []
    for name, index, figure in (("ttft_vs_solo", 0, lambda o: o.ttft_ms), ("stall_vs_solo", 1, lambda o: o.stall_ms)):
        if skipped:
            out.append(check(name, None, None, None, note=f"skipped: {skipped}"))
            continue
        limits = solo_limits(outs, solo, figure)
        waits = []
        for o in outs:
            limit = limits.get(o.spec.id)
            if o.stream is None or figure(o) is None or limit is None or len(o.stream.arrivals_ns) <= index:
                continue
            waits += [stalls.Wait(o.stream, 0, limit.ms)] if index == 0 else stalls.waits_of(o.stream, limit.ms)
        if not waits:
            out.append(check(name, None, None, None, note="no samples"))
            continue
        detail = "; ".join(f"{o.spec.id}: {figure(o):.1f} vs {limits[o.spec.id].describe()}" for o in outs
                           if figure(o) is not None and o.spec.id in limits)
        record = _charged_check(name, waits, outs, rule, f"{SOLO_RULE}; {detail}")
        out.append(record | {"limits": {i: lim.to_json() for i, lim in limits.items()}})
    greedy = [o for o in outs if o.spec.temperature == 0 and not o.error and _tokens(o)]
    if not greedy:  # nothing streamed to compare: not a pass (`completed` says what failed)
        out.append(check("parity_vs_solo", None, None, None, note="no greedy request streamed any output"))
        return out
    mismatched = [o.spec.id for o in greedy if _tokens(o) != _tokens(solo[o.spec.id])]
    out.append(check("parity_vs_solo", not mismatched, len(mismatched), 0,
                     note="greedy output together equals alone" + (f": {mismatched}" if mismatched else "")))
    return out


def speculated_note(outs: list[Streamed]) -> str | None:
    """Requests sent `speculative: false` that the server speculated anyway (judged as speculative)."""
    against = [o for o in outs if o.was_speculated_against_ask]
    if not against:
        return None
    return "; ".join(f"{o.spec.id}: sent speculative: false, the server speculated it"
                     + (f" (timings.draft_n = {o.timings.get('draft_n')})" if o.timings else "")
                     for o in against) + "; judged as speculative"


def classic_served_check(outs: list[Streamed]) -> dict | None:
    """Skipped when the scenario asked for classic requests and the server served none classically:
    whether it stalls classic streams was not tested."""
    note = speculated_note(outs)
    if note is None or any(not o.is_speculative for o in outs):
        return None
    return check("classic_served", None, None, None,
                 note=f"skipped: {note}: no request was served classically, so whether classic streams "
                      "stall was not tested")


def _tokens(o: Streamed | Solo):
    return o.token_ids or o.text


def completion_check(outs: list[Streamed]) -> dict:
    failed = [f"{o.spec.id}: {o.error or 'no finish_reason'}" for o in outs if o.error or not o.finish_reason]
    return check("completed", not failed, len(failed), 0,
                 note="every request streamed to a finish" + (f": {'; '.join(failed)}" if failed else ""))


# -- the trace ------------------------------------------------------------------------
def live_schedule(specs: Sequence[RequestSpec], solo: dict[str, Solo]) -> tuple[list[RequestSpec], dict]:
    """The scenario's arrivals scaled to the server's speed: a request sent after others is meant to
    find them running, so every arrival lands within the first half of each earlier request's solo
    run (a fast server would otherwise finish one before the next is sent). Never slower than written."""
    scale = 1.0
    for r in specs:
        for q in specs:
            life = solo[q.id].life_ms if q.id in solo else None
            if q.arrival_ms < r.arrival_ms and life:
                scale = min(scale, (q.arrival_ms + life / 2) / r.arrival_ms)
    scaled = [replace(r, arrival_ms=round(r.arrival_ms * scale, 3)) for r in specs]
    note = ("as written" if scale == 1.0 else
            f"arrivals x {scale:.3f}, so that each request is sent within the first half of the solo run of "
            f"every request sent before it")
    return scaled, {"scale": round(scale, 6), "note": note,
                    "arrival_ms": {r.id: r.arrival_ms for r in scaled}}


def in_flight_check(outs: list[Streamed], concurrency: int, looped: set[str]) -> dict:
    """A closed loop's users: never more of its requests in flight (sent -> stream end) than users."""
    spans = [(o.sent_ms, o.end_ms) for o in outs if o.spec.id in looped and o.end_ms is not None]
    most = max((sum(a <= t < b for a, b in spans) for t, _ in spans), default=0)
    return check("in_flight", most <= concurrency, most, concurrency,
                 note=f"closed loop: the most of its requests in flight at once (sent to stream end) <= "
                      f"concurrency {concurrency}")


def run_against_target(scenario: Scenario, url: str, seed: int, console=None, *, warm: bool = True) -> dict:
    target = Target(url)
    target.ping()
    health = target.get_json("/health") or {}
    models = (target.get_json("/v1/models") or {}).get("data") or []
    model = models[0].get("id") if models else None  # no listed model: leave `model` out
    costs = health.get("costs") if isinstance(health.get("costs"), dict) else None
    workload = scenario.workload
    closed = workload is not None and workload.is_closed
    specs = list(scenario.specs(seed))

    if warm:
        warm_up(target, specs, seed, model)
    solo: dict[str, Solo] = {}
    schedule = None
    if costs is None:  # learn each request's solo figures first
        for spec in specs:
            solo[spec.id] = Solo([run_together(target, [replace(spec, arrival_ms=0.0)], seed, model)[0]
                                  for _ in range(SOLO_RUNS)])
        if not closed:  # a closed loop's arrivals are its finishes
            specs, schedule = live_schedule(specs, solo)
    attempts = 0
    while True:  # a client stalled at the wrong moment may keep the requests apart: try again
        before = client.spec_counters(client.try_scrape(target.url))  # the counters count the last attempt
        outs, attempts = drive(target, specs, workload, seed, model), attempts + 1
        if closed or attempts == TOGETHER_RUNS or overlap_note(outs) is None:
            break
    after = client.settled(lambda: client.spec_counters(client.try_scrape(target.url)))
    counted = counter_delta(before, after)

    checks = [completion_check(outs)]
    if closed:
        checks.append(in_flight_check(outs, workload.concurrency or 1, set(workload.ids())))
    if costs is not None:
        checks += cost_checks(outs, scenario, CostModel(**costs["profile"]), health, seed)
    else:
        checks += solo_checks(outs, solo)
    served = classic_served_check(outs)
    if served:
        checks.append(served)
    trace = to_trace(scenario, outs, solo, checks, seed, url, health, model)
    trace["server"]["spec_counters"] = counted
    if schedule is not None:
        trace["schedule"] = schedule
    trace["together_runs"] = attempts
    note = speculated_note(outs)
    if note:
        trace["speculated_against_ask"] = [o.spec.id for o in outs if o.was_speculated_against_ask]
        trace["speculated_note"] = note
    if console is not None:
        print_verdict(console, trace)
    return trace


def counter_delta(before: dict | None, after: dict | None) -> dict | None:
    """What the run added to the server's speculative counters (None: it serves none)."""
    if before is None or after is None:
        return None
    return {key: None if after[key] is None or before[key] is None else after[key] - before[key]
            for key in after}


def _request_json(o: Streamed, seed: int) -> dict:
    times = [round(t, 3) for t in o.token_times_ms]
    return {"id": o.spec.id, "server_id": o.server_id, "speculative": o.is_speculative, "eligible": o.spec.speculative,
            "prompt_token_ids": list(o.spec.prompt_tokens(seed)), "token_ids": list(o.token_ids),
            "num_tokens": len(times), "token_times_ms": times, "arrival_ms": round(o.sent_ms, 3),
            "tick_end_ms": _tick_ends_ms(o), "end_ms": None if o.end_ms is None else round(o.end_ms, 3),
            "timings": o.timings, "finish_reason": o.finish_reason, "error": o.error,
            "metrics": metrics.request_metrics(o.sent_ms, o.token_times_ms)}


def _tick_ends_ms(o: Streamed) -> list[float] | None:
    """Each token's engine tick end on the trace's clock (servers that stamp their events)."""
    if o.stream is None or o.stream.ticks_ns is None:
        return None
    origin = o.stream.sent_ns - round(o.sent_ms * 1e6)
    return [round((t - origin) / 1e6, 3) for t in o.stream.ticks_ns]


def to_trace(scenario, outs, solo, checks, seed, url, health, model) -> dict:
    requests = [_request_json(o, seed) for o in outs]
    trace = {"scenario": scenario.name, "mode": health.get("mode") or "external", "clock": "real", "seed": seed,
             "target": url, "server": {"model": model, "health": health or None},
             "requests": requests, "ticks": [], "bursts": [], "checks": checks,
             "throughput": metrics.throughput([{**r, "token_ids": [0] * r["num_tokens"]} for r in requests])}
    if solo:
        trace["solo"] = {i: {"ttft_ms": s.ttft_ms, "stall_ms": s.stall_ms, "num_tokens": s.num_tokens,
                             "runs": len(s.runs), "life_ms": s.life_ms, "pace_ms": stalls.pace_ms(s.streams),
                             "kind": s.runs[0].kind} for i, s in solo.items()}
    # a server's ticks are not visible over HTTP (its per-token tick stamps are in `tick_end_ms`);
    # only a server that reports BurstFinalized records (coopsched serve) has bursts
    trace["bursts"] = [{**o.burst, "seq_id": o.spec.id, "server_seq_id": o.burst.get("seq_id")}
                       for o in outs if o.burst]
    return trace


def print_verdict(console, trace: dict) -> None:
    console.print(f"[bold]{trace['scenario']}[/] against {trace['target']} (mode {trace['mode']}, real time)")
    if "solo" in trace:
        console.print(f"  the server reports no costs: each request ran alone first; rule: {SOLO_RULE}")
    counted = trace["server"].get("spec_counters")
    if counted:
        console.print("  the server's speculative counters over the run: " + ", ".join(
            f"{key} {'-' if value is None else f'{value:g}'}" for key, value in counted.items()), highlight=False)
    if trace.get("schedule", {}).get("scale", 1.0) != 1.0:
        console.print(f"  schedule: {trace['schedule']['note']}: {trace['schedule']['arrival_ms']}", highlight=False)
    if trace.get("speculated_note"):
        console.print(f"  [yellow]{trace['speculated_note']}[/]", highlight=False)
    for c in trace["checks"]:
        verdict = "skipped" if c.get("skipped") else ("[green]ok[/]" if c["ok"] else "[red]FAIL[/]")
        value = "-" if c["value"] is None else f"{c['value']:.1f}" if isinstance(c["value"], float) else c["value"]
        bound = "-" if c["bound"] is None else f"{c['bound']:.1f}" if isinstance(c["bound"], float) else c["bound"]
        console.print(f"  {c['name']}: {value} vs {bound} {verdict}  ({c['note']})", highlight=False)
