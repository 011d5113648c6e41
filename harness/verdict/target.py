"""The checks of `coopsched run NAME --target URL`, registered by name: bounds from the server's
/health costs, else the solo rule (each request alone first, harness/live/solo.py); time checks
are charged through the stall rule (harness/live/stalls.py). Each returns a `Check`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from harness.live import stalls
from harness.live.solo import RULE as SOLO_RULE
from harness.live.solo import SoloLimit, ceiling_ms, solo_limit_of
from harness.live.streamed import Solo, Streamed
from harness.run import metrics
from harness.run.bounds import REAL_TIME_ALLOWANCE
from harness.run.scenario import Scenario
from harness.verdict.check import Check
from harness.verdict.live import DEFAULT_BLOCK_SIZE, stall_check
from mocks import CostModel

SLACK_MS = 10.0          # real-time slack on every cost-derived bound (HTTP, thread wake-ups)
ORDER_TOLERANCE_MS = 5.0  # requests sent this close together may reach the server in either order
OVERLAP_SHARE = 0.25  # two requests overlapped when they were in flight together for this share of the shorter
UNBOUNDED = 10**9  # a wait that legitimately holds other rows' whole replies: no run-ahead can be told apart


@dataclass
class CostTerms:
    """The server's cost terms for one run (ms), with the real-time allowance."""
    decode: float                 # a decode step at the run's classic batch size
    spec_action: float            # one round, or the longest speculative slice 0
    admission: dict               # request id -> its admission (classic prefill or slice 0)
    grant_rounds: int
    backlog_cap: int
    max_batch_size: int
    block_size: int = DEFAULT_BLOCK_SIZE

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
    block = health.get("block_size", DEFAULT_BLOCK_SIZE)
    return CostTerms(cost.decode(max(num_classic, 1)), max([cost.round(block, 1), *slice0.values()]), admission,
                     health.get("grant_rounds", 8), health.get("backlog_cap", 2), health.get("max_batch_size", 8),
                     block)


def _pending(outs: list[Streamed], start: float, end: float, skip: Streamed) -> list[Streamed]:
    """Requests sent by `end` that got their first token after `start`: each may put one admission
    and one speculative action (strict alternation) into that span."""
    return [p for p in outs if p is not skip and p.sent_ms <= end
            and (not p.token_times_ms or p.token_times_ms[0] > start)]


def _charged_check(name: str, waits: list[stalls.Wait], outs: list[Streamed], rule: stalls.Rule,
                   limit: str) -> Check:
    """A time check whose waits over their limit fail it only when the stall rule charges them."""
    return stall_check(name, waits, [o.stream for o in outs if o.stream is not None], rule, limit)


# -- bounds from the server's costs -------------------------------------------------------
def ttft_check(outs: list[Streamed], terms: CostTerms) -> Check:
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
        return Check.skip("ttft", "no request produced a token")
    return _charged_check("ttft", waits, outs, terms.rule,
                          f"TTFT <= 1.5 x (own admission + decode + one spec action + one admission and spec "
                          f"action per request ahead + a waiter's grant wait) + {SLACK_MS:g} ms; "
                          + "; ".join(f"{w.stream.id}: {w.ms:.1f} vs {w.limit_ms:.1f}" for w in waits))


def classic_gap_check(outs: list[Streamed], terms: CostTerms, per_gap: int) -> Check:
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
        return Check.skip("classic_itl", "no classic gaps")
    return _charged_check("classic_itl", waits, outs, terms.rule,
                          f"gap <= 1.5 x (decode {terms.decode:.1f} + {per_gap} x spec action "
                          f"{terms.spec_action:.1f} + one admission and spec action per pending request) "
                          f"+ {SLACK_MS:g} ms")


def burst_wall_check(outs: list[Streamed], terms: CostTerms) -> Check:
    bursts = [(o.spec.id, o.burst["burst_wall_ms"]) for o in outs if o.burst]
    if not bursts:
        return Check.skip("burst_wall", "the server reports no BurstFinalized records")
    worst = max(bursts, key=lambda b: b[1])
    bound = terms.allow(1.05 * terms.spec_action)
    return Check("burst_wall", worst[1] <= bound, worst[1], bound,
                 note=f"worst: {worst[0]}; the longest tick a speculative request held <= 1.5 x 1.05 x "
                      f"max(round, slice 0) + {SLACK_MS:g} ms")


def cost_checks(outs: list[Streamed], scenario: Scenario, cost: CostModel, health: dict,
                seed: int) -> list[Check]:
    """Bounds from the server's cost terms, as the virtual harness builds them, with the real-time allowance."""
    terms = cost_terms(outs, cost, health, seed)
    out = [ttft_check(outs, terms)]
    wanted = scenario.checks
    if "classic_itl" in wanted:
        apart = overlap_note(outs)
        out.append(Check.skip("classic_itl", f"skipped: {apart}") if apart else
                   classic_gap_check(outs, terms, wanted["classic_itl"].get("spec_actions_per_gap", 1)))
    if "burst_wall" in wanted:
        out.append(burst_wall_check(outs, terms))
    return out


# -- against the solo runs (servers that report no costs) ------------------------------------
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


def solo_limits(outs: list[Streamed], solo: dict[str, Solo], figure, capped: bool = True) -> dict[str, SoloLimit]:
    """Each request's limit from its solo figure, with a ceiling from the other requests' solo runs
    when `capped` (gaps, where a burst hides; a TTFT's wait is judged by what others made in it)."""
    out = {}
    for o in outs:
        alone = figure(solo[o.spec.id])
        if alone is not None:
            ceiling = ceiling_ms(s.life_ms for i, s in solo.items() if i != o.spec.id) if capped else None
            out[o.spec.id] = solo_limit_of(alone, ceiling)
    return out


def solo_rule(solo: dict[str, Solo], block_size: int | None = None) -> stalls.Rule:
    """The stall rule against solo runs: R is the server's block size when it reports one (coopsched
    serve's /health), else the most tokens one event carried alone; each kind's pace from its solo runs."""
    streams_alone = [st for s in solo.values() for st in s.streams]
    events = max((s.max_event_tokens for s in solo.values()), default=1)
    return stalls.Rule(tokens_per_round=block_size or events, pace_ms=stalls.pace_ms(streams_alone),
                       paces=stalls.paces_by_kind(streams_alone))


def vs_solo_check(name: str, outs: list[Streamed], solo: dict[str, Solo], rule: stalls.Rule) -> Check:
    """`ttft_vs_solo` (index 0) or `stall_vs_solo` (every gap): within the solo rule, a wait over it
    charged only if a stream ran ahead in it; skipped when the requests did not overlap."""
    skipped = overlap_note(outs)
    if skipped:
        return Check.skip(name, f"skipped: {skipped}")
    index, figure = (0, lambda o: o.ttft_ms) if name == "ttft_vs_solo" else (1, lambda o: o.stall_ms)
    limits = solo_limits(outs, solo, figure, capped=index == 1)
    waits = []
    for o in outs:
        limit = limits.get(o.spec.id)
        if o.stream is None or figure(o) is None or limit is None or len(o.stream.arrivals_ns) <= index:
            continue
        waits += [stalls.Wait(o.stream, 0, limit.ms)] if index == 0 else stalls.waits_of(o.stream, limit.ms)
    if not waits:
        return Check.skip(name, "no samples")
    detail = "; ".join(f"{o.spec.id}: {figure(o):.1f} vs {limits[o.spec.id].describe()}" for o in outs
                       if figure(o) is not None and o.spec.id in limits)
    charged = _charged_check(name, waits, outs, rule, f"{SOLO_RULE}; {detail}")
    extra = {**charged.extra, "limits": {i: lim.to_json() for i, lim in limits.items()}}
    return Check(charged.name, charged.holds, charged.value, charged.bound, note=charged.note, extra=extra)


def parity_vs_solo_check(outs: list[Streamed], solo: dict[str, Solo]) -> Check:
    greedy = [o for o in outs if o.spec.temperature == 0 and not o.error and _tokens(o)]
    if not greedy:  # nothing streamed to compare: not a pass (`completed` says what failed)
        return Check.skip("parity_vs_solo", "no greedy request streamed any output")
    mismatched = [o.spec.id for o in greedy if _tokens(o) != _tokens(solo[o.spec.id])]
    return Check("parity_vs_solo", not mismatched, len(mismatched), 0,
                 note="greedy output together equals alone" + (f": {mismatched}" if mismatched else ""))


def solo_checks(outs: list[Streamed], solo: dict[str, Solo], block_size: int | None = None) -> list[Check]:
    """Together vs alone: TTFT and every gap within the solo rule, and greedy output equal to alone."""
    rule = solo_rule(solo, block_size)
    return [vs_solo_check("ttft_vs_solo", outs, solo, rule), vs_solo_check("stall_vs_solo", outs, solo, rule),
            parity_vs_solo_check(outs, solo)]


def _tokens(o: Streamed | Solo):
    return o.token_ids or o.text


# -- what every run gets -------------------------------------------------------------------
def speculated_note(outs: list[Streamed]) -> str | None:
    """Requests sent `speculative: false` that the server speculated anyway (judged as speculative)."""
    against = [o for o in outs if o.was_speculated_against_ask]
    if not against:
        return None
    return "; ".join(f"{o.spec.id}: sent speculative: false, the server speculated it"
                     + (f" (timings.draft_n = {o.timings.get('draft_n')})" if o.timings else "")
                     for o in against) + "; judged as speculative"


def classic_served_check(outs: list[Streamed]) -> Check | None:
    """Skipped when the scenario asked for classic requests and the server served none classically:
    whether it stalls classic streams was not tested."""
    note = speculated_note(outs)
    if note is None or any(not o.is_speculative for o in outs):
        return None
    return Check.skip("classic_served", f"skipped: {note}: no request was served classically, so whether "
                                        "classic streams stall was not tested")


def completion_check(outs: list[Streamed]) -> Check:
    failed = [f"{o.spec.id}: {o.error or 'no finish_reason'}" for o in outs if o.error or not o.finish_reason]
    return Check("completed", not failed, len(failed), 0,
                 note="every request streamed to a finish" + (f": {'; '.join(failed)}" if failed else ""))


def in_flight_check(outs: list[Streamed], concurrency: int, looped: set[str]) -> Check:
    """A closed loop's users: never more of its requests in flight (sent -> stream end) than users."""
    spans = [(o.sent_ms, o.end_ms) for o in outs if o.spec.id in looped and o.end_ms is not None]
    most = max((sum(a <= t < b for a, b in spans) for t, _ in spans), default=0)
    return Check("in_flight", most <= concurrency, most, concurrency,
                 note=f"closed loop: the most of its requests in flight at once (sent to stream end) <= "
                      f"concurrency {concurrency}")


# -- the registry ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Registered:
    fn: Callable[..., Check | list[Check] | None]
    applies: str   # which runs get it
    guards: str    # what it guards against (docs/verdicts.md lists these)


CHECKS: dict[str, Registered] = {
    "completed": Registered(completion_check, "every run", "a request that errored or never finished"),
    "in_flight": Registered(in_flight_check, "a closed-loop [workload]",
                            "more of the loop's requests in flight than its users"),
    "ttft": Registered(ttft_check, "the server reports its costs", "a TTFT past its admission, a round per "
                       "request ahead and a waiter's grant wait while another stream ran ahead"),
    "classic_itl": Registered(classic_gap_check, "costs, and the scenario asks for classic_itl",
                              "a classic gap past decode + a spec action per gap while another stream ran ahead "
                              "(skipped when no two requests overlapped)"),
    "burst_wall": Registered(burst_wall_check, "costs, and the scenario asks for burst_wall",
                             "a tick longer than one round or slice 0 (from the server's BurstFinalized records)"),
    "ttft_vs_solo": Registered(vs_solo_check, "no costs", "a TTFT past the solo limit while another stream ran "
                               "ahead (a server that serves one request at a time)"),
    "stall_vs_solo": Registered(vs_solo_check, "no costs", "a gap past the solo limit while another stream ran "
                                "ahead (the legacy burst)"),
    "parity_vs_solo": Registered(parity_vs_solo_check, "no costs", "greedy output together unlike alone"),
    "classic_served": Registered(classic_served_check, "a server that speculated every request",
                                 "a run that says ok about classic streams it never served (always skipped)"),
}
