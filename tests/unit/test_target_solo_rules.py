"""`--target` against a server that reports nothing: solo limits' floor and ceiling, the overlap skip,
the live schedule, and a classic request the server speculated (harness/verdict/target.py, solo.py,
harness/live/http_target.py).

Streams are built by hand (times in ms), as the live client would fill them.
"""

from __future__ import annotations

import pytest

from harness.live import http_target as ht
from harness.live import solo as solo_rule
from harness.live import stalls
from harness.live.streamed import Solo, Streamed
from harness.run.scenario import RequestSpec
from harness.verdict import target

CLASSIC = RequestSpec("classic", 0.0, max_tokens=8, speculative=False)
SPEC = RequestSpec("spec", 40.0, max_tokens=8)


def streamed(spec: RequestSpec, sent_ms: float, times_ms: list[float], **fields) -> Streamed:
    out = Streamed(spec, sent_ms=sent_ms, token_times_ms=times_ms, finish_reason="length", **fields)
    out.end_ms = times_ms[-1] + 0.1
    return out


def alone(spec: RequestSpec, times_ms: list[float]) -> Solo:
    return Solo([streamed(spec, 0.0, times_ms)])


def test_a_solo_limit_is_clamped_to_its_floor_and_ceiling():
    free = solo_rule.solo_limit_of(10.0)
    assert (free.ms, free.floor_ms, free.ceiling_ms) == (55.0, 25.0, None)
    capped = solo_rule.solo_limit_of(10.0, ceiling_ms=40.0)
    assert capped.ms == 40.0 and "floor 25.0, ceiling 40.0: 40.0 ms" in capped.describe()
    floored = solo_rule.solo_limit_of(10.0, ceiling_ms=20.0)  # never below the slack
    assert floored.ms == 25.0
    # measured at load 10: one solo gap of 92 ms; the ceiling (half the other's 81 ms solo run) wins over
    # 3 x 92 + 25, so the legacy burst's 83 ms gap is over its limit (it was under 92 + 25 = 117)
    noisy = solo_rule.solo_limit_of(92.0, ceiling_ms=81.0 / 2)
    assert noisy.ms == 40.5 < 83.1
    assert solo_rule.solo_limit(10.0) == 55.0  # the locust file's call, unchanged
    assert solo_rule.ceiling_ms([80.0, None, 120.0]) == 40.0 and solo_rule.ceiling_ms([]) is None


def test_the_ceiling_comes_from_the_other_requests_solo_runs():
    outs = [streamed(CLASSIC, 0.0, [5.0, 10.0]), streamed(SPEC, 40.0, [50.0, 60.0])]
    solo = {"classic": alone(CLASSIC, [5.0 + i for i in range(8)]), "spec": alone(SPEC, [70.0 + i for i in range(8)])}
    limits = target.solo_limits(outs, solo, lambda s: s.ttft_ms)
    assert limits["classic"].ceiling_ms == pytest.approx(77.0 / 2)  # half the speculative request's solo run
    assert limits["spec"].ceiling_ms == pytest.approx(12.0 / 2)
    assert limits["spec"].ms == limits["spec"].floor_ms == 25.0  # the ceiling (6) cannot cut below the slack


def test_a_solo_figure_is_the_median_of_the_runs_so_one_frozen_run_does_not_set_it():
    """Measured at load 7: one of three classic solo runs froze 1,609 ms, and its figure made the limit
    1,634 ms, which the legacy burst's 1,154 ms classic gap stayed under."""
    runs = [streamed(CLASSIC, 0.0, [6.0, 11.0, 16.0]), streamed(CLASSIC, 0.0, [6.4, 1615.4, 1620.0]),
            streamed(CLASSIC, 0.0, [5.0, 10.5, 15.0])]
    solo = Solo(runs)
    assert solo.stall_ms == 5.5 and solo.ttft_ms == 6.4  # a TTFT's figure stays the worst (no ceiling)
    assert max(r.stall_ms for r in runs) == 1609.0  # planted: the worst of the runs, the old figure
    assert solo_rule.median([None, 3.0, 1.0]) == 2.0 and solo_rule.median([None]) is None


def test_requests_that_never_overlapped_skip_the_checks_that_compare_together_with_alone():
    apart = [streamed(CLASSIC, 0.0, [5.0, 33.0]), streamed(SPEC, 40.0, [45.0, 50.0])]
    note = target.overlap_note(apart)
    assert note and "no two requests overlapped for 25% of the shorter (classic 0.0-33.0 ms, spec 40.0-50.0 ms)" in note
    solo = {"classic": alone(CLASSIC, [5.0, 33.0]), "spec": alone(SPEC, [5.0, 10.0])}
    checks = {c.name: c.to_json() for c in target.solo_checks(apart, solo)}
    assert checks["stall_vs_solo"]["skipped"] and checks["ttft_vs_solo"]["skipped"]
    assert "no two requests overlapped" in checks["stall_vs_solo"]["note"]
    together = [streamed(CLASSIC, 0.0, [5.0, 45.0]), streamed(SPEC, 40.0, [44.0, 50.0])]
    assert target.overlap_note(together) is None
    grazed = [streamed(CLASSIC, 13.5, [20.0, 332.9]), streamed(SPEC, 331.1, [715.4, 716.5])]  # measured
    assert "no two requests overlapped" in target.overlap_note(grazed)  # 1.8 ms together: alone again


def test_the_live_schedule_sends_each_request_within_the_first_half_of_the_earlier_ones_solo_runs():
    solo = {"classic": alone(CLASSIC, [1.0 + i for i in range(32)]), "spec": alone(SPEC, [2.0, 3.0])}
    specs, schedule = ht.live_schedule([CLASSIC, SPEC], solo)
    assert [s.arrival_ms for s in specs] == [0.0, 16.0] and schedule["scale"] == pytest.approx(0.4)
    slow = {"classic": alone(CLASSIC, [10.0 * i for i in range(1, 65)]), "spec": alone(SPEC, [2.0, 3.0])}
    specs, schedule = ht.live_schedule([CLASSIC, SPEC], slow)
    assert [s.arrival_ms for s in specs] == [0.0, 40.0] and schedule["note"] == "as written"  # never slower


def test_a_classic_request_the_server_speculated_is_judged_as_speculative():
    ignored = streamed(CLASSIC, 0.0, [5.0, 10.0], served_speculatively=True, timings={"draft_n": 12})
    assert ignored.is_speculative and ignored.kind == "spec" and ignored.was_speculated_against_ask
    spec = streamed(SPEC, 1.0, [6.0, 11.0], served_speculatively=True)
    note = target.speculated_note([ignored, spec])
    assert note == "classic: sent speculative: false, the server speculated it (timings.draft_n = 12); " \
                   "judged as speculative"
    skipped = target.classic_served_check([ignored, spec])
    assert skipped.skipped and "whether classic streams stall was not tested" in skipped.note
    honoured = streamed(CLASSIC, 0.0, [5.0, 10.0], served_speculatively=False)
    assert target.classic_served_check([honoured, spec]) is None and target.speculated_note([honoured, spec]) is None


def test_the_closed_loop_check_counts_requests_in_flight():
    loop = {"w0", "w1", "w2"}
    specs = [RequestSpec(i) for i in sorted(loop)]
    outs = [streamed(specs[0], 0.0, [5.0]), streamed(specs[1], 0.0, [6.0]), streamed(specs[2], 5.2, [9.0])]
    held = target.in_flight_check(outs, 2, loop)
    assert held.ok and held.value == 2
    outs[2].sent_ms = 1.0  # planted: a third request sent while two are in flight
    assert not target.in_flight_check(outs, 2, loop).ok


def with_stream(out: Streamed) -> Streamed:
    """The stall rule's record of a hand-written stream (one token per event, times in ms)."""
    ns = lambda ms: round(ms * 1e6)
    out.stream = stalls.Stream(out.spec.id, out.kind, ns(out.sent_ms), tuple(ns(t) for t in out.token_times_ms))
    return out


def test_r_is_the_block_size_the_server_reports_not_one_token_per_event():
    """coopsched serve on MLX reports no costs but its block size (K = 4); its events carry one token
    each. Measured: the classic gap that held the speculative request's slice 0 and first round (5
    tokens) was 36.5 ms against a 36.0 ms limit, charged with R = 1 from the events."""
    classic_times = [2.0 * i for i in range(1, 21)] + [76.5 + 2.0 * i for i in range(12)]
    outs = [with_stream(streamed(CLASSIC, 0.0, classic_times)),
            with_stream(streamed(SPEC, 45.0, [70.0, 75.0, 75.0, 75.0, 75.0, 160.0, 260.0, 400.0]))]
    solo = {"classic": alone(CLASSIC, [2.0 * i for i in range(1, 33)]),
            "spec": alone(SPEC, [25.0, 30.0, 30.0, 30.0, 30.0, 80.0, 130.0, 330.0])}  # 41 ms a token
    for o in (*solo["classic"].runs, *solo["spec"].runs):
        with_stream(o)
    stall = lambda checks: next(c for c in checks if c.name == "stall_vs_solo")
    from_events = stall(target.solo_checks(outs, solo))
    worst = from_events.extra["stalls"]["worst_hol"]
    assert not from_events.holds and (worst["token"], worst["ms"], worst["evidence_tokens"]) == (20, 36.5, 5)
    assert worst["allowance_tokens"] == 1 + 1 + 1 + 1  # R 1 + slice 0 + R 1 for reordering + 36.5 / 41
    from_health = stall(target.solo_checks(outs, solo, block_size=4))
    assert from_health.holds and from_health.extra["stalls"]["worst_noise"]["allowance_tokens"] == 4 + 1 + 4 + 1
