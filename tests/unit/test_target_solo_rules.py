"""`--target` against a server that reports nothing: solo limits' floor and ceiling, the overlap skip,
the live schedule, and a classic request the server speculated (harness/live/http_target.py, solo.py).

Streams are built by hand (times in ms), as the live client would fill them.
"""

from __future__ import annotations

import pytest

from harness.live import http_target as ht
from harness.live import solo as solo_rule
from harness.run.scenario import RequestSpec

CLASSIC = RequestSpec("classic", 0.0, max_tokens=8, speculative=False)
SPEC = RequestSpec("spec", 40.0, max_tokens=8)


def streamed(spec: RequestSpec, sent_ms: float, times_ms: list[float], **fields) -> ht.Streamed:
    out = ht.Streamed(spec, sent_ms=sent_ms, token_times_ms=times_ms, finish_reason="length", **fields)
    out.end_ms = times_ms[-1] + 0.1
    return out


def alone(spec: RequestSpec, times_ms: list[float]) -> ht.Solo:
    return ht.Solo([streamed(spec, 0.0, times_ms)])


def test_a_solo_limit_is_clamped_to_its_floor_and_ceiling():
    free = solo_rule.solo_limit_of(10.0)
    assert (free.ms, free.floor_ms, free.ceiling_ms) == (55.0, 35.0, None)
    capped = solo_rule.solo_limit_of(10.0, ceiling_ms=40.0)
    assert capped.ms == 40.0 and "floor 35.0, ceiling 40.0: 40.0 ms" in capped.describe()
    floored = solo_rule.solo_limit_of(10.0, ceiling_ms=20.0)  # never below what it took alone + the slack
    assert floored.ms == 35.0
    assert solo_rule.solo_limit(10.0) == 55.0  # the locust file's call, unchanged
    assert solo_rule.ceiling_ms([80.0, None, 120.0]) == 40.0 and solo_rule.ceiling_ms([]) is None


def test_the_ceiling_comes_from_the_other_requests_solo_runs():
    outs = [streamed(CLASSIC, 0.0, [5.0, 10.0]), streamed(SPEC, 40.0, [50.0, 60.0])]
    solo = {"classic": alone(CLASSIC, [5.0 + i for i in range(8)]), "spec": alone(SPEC, [70.0 + i for i in range(8)])}
    limits = ht.solo_limits(outs, solo, lambda s: s.ttft_ms)
    assert limits["classic"].ceiling_ms == pytest.approx(77.0 / 2)  # half the speculative request's solo run
    assert limits["spec"].ceiling_ms == pytest.approx(12.0 / 2)
    assert limits["spec"].ms == limits["spec"].floor_ms == 95.0  # 70 + 25: the ceiling cannot cut below


def test_requests_that_never_overlapped_skip_the_checks_that_compare_together_with_alone():
    apart = [streamed(CLASSIC, 0.0, [5.0, 33.0]), streamed(SPEC, 40.0, [45.0, 50.0])]
    note = ht.overlap_note(apart)
    assert note and "no two requests overlapped for 25% of the shorter (classic 0.0-33.0 ms, spec 40.0-50.0 ms)" in note
    solo = {"classic": alone(CLASSIC, [5.0, 33.0]), "spec": alone(SPEC, [5.0, 10.0])}
    checks = {c["name"]: c for c in ht.solo_checks(apart, solo)}
    assert checks["stall_vs_solo"]["skipped"] and checks["ttft_vs_solo"]["skipped"]
    assert "no two requests overlapped" in checks["stall_vs_solo"]["note"]
    together = [streamed(CLASSIC, 0.0, [5.0, 45.0]), streamed(SPEC, 40.0, [44.0, 50.0])]
    assert ht.overlap_note(together) is None
    grazed = [streamed(CLASSIC, 13.5, [20.0, 332.9]), streamed(SPEC, 331.1, [715.4, 716.5])]  # measured
    assert "no two requests overlapped" in ht.overlap_note(grazed)  # 1.8 ms together: alone again


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
    note = ht.speculated_note([ignored, spec])
    assert note == "classic: sent speculative: false, the server speculated it (timings.draft_n = 12); " \
                   "judged as speculative"
    skipped = ht.classic_served_check([ignored, spec])
    assert skipped["skipped"] and "whether classic streams stall was not tested" in skipped["note"]
    honoured = streamed(CLASSIC, 0.0, [5.0, 10.0], served_speculatively=False)
    assert ht.classic_served_check([honoured, spec]) is None and ht.speculated_note([honoured, spec]) is None


def test_the_closed_loop_check_counts_requests_in_flight():
    loop = {"w0", "w1", "w2"}
    specs = [RequestSpec(i) for i in sorted(loop)]
    outs = [streamed(specs[0], 0.0, [5.0]), streamed(specs[1], 0.0, [6.0]), streamed(specs[2], 5.2, [9.0])]
    held = ht.in_flight_check(outs, 2, loop)
    assert held["ok"] and held["value"] == 2
    outs[2].sent_ms = 1.0  # planted: a third request sent while two are in flight
    assert not ht.in_flight_check(outs, 2, loop)["ok"]
