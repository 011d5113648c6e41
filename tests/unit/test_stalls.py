"""The stall rule (harness/live/stalls.py): a wait over its limit is charged only when a stream ran ahead in it.

Timelines are written in ms and turned into the ns the live clients record. A slice-mode
schedule alternates one classic token with one round of K = 4 tokens; a frozen machine
stretches a gap without adding any token; a burst puts a whole reply inside one gap.
"""

from __future__ import annotations

import pytest

from harness.live import stalls

MS = 1_000_000
RULE = stalls.Rule(tokens_per_round=4)


def stream(id, times_ms, ticks_ms=None, kind="classic", sent_ms=0.0):
    ns = lambda ts: tuple(round(t * MS) for t in ts)
    return stalls.Stream(id, kind, round(sent_ms * MS), ns(times_ms), None if ticks_ms is None else ns(ticks_ms))


def judge(waits, streams, rule=RULE):
    line = stalls.judge(waits, streams, rule)
    return line, [(w.verdict, w.evidence) for w in waits]


def slice_schedule(n=6, freeze_after=None, freeze_ms=0.0):
    """Classic token every 35 ms, a round of 4 spec tokens 30 ms into each gap; a freeze shifts everything."""
    classic, spec = [], []
    shift = 0.0
    for i in range(n):
        if freeze_after is not None and i == freeze_after + 1:
            shift += freeze_ms
        classic.append(35.0 * i + shift)
        if i:
            spec += [35.0 * i - 5 + shift] * 4
    return classic, spec


@pytest.mark.parametrize("timed", [True, False], ids=["server-ticks", "client-arrivals"])
def test_a_frozen_machine_is_noise_and_counts_at_the_limit(timed):
    classic, spec = slice_schedule(freeze_after=2, freeze_ms=60.0)
    c = stream("classic", classic, classic if timed else None)
    s = stream("spec", spec, spec if timed else None, kind="spec")
    waits = stalls.waits_of(c, 69.4)
    line, verdicts = judge(waits, [c, s])
    assert line == (stalls.SERVER if timed else stalls.CLIENT)
    assert verdicts[2] == ("noise", 4)  # 95 ms, one round inside
    assert all(v == "ok" for i, (v, _) in enumerate(verdicts) if i != 2)
    assert waits[2].charged_ms == 69.4 and stalls.summarize(waits, line, RULE).num_hol == 0


def test_a_burst_inside_a_gap_is_a_head_of_line_block():
    classic = [0.0, 5.0, 805.0, 810.0]
    spec = [800.0] * 64  # the whole reply in one tick, streamed in one lump
    c, s = stream("classic", classic, classic), stream("spec", spec, spec, kind="spec")
    waits = stalls.waits_of(c, 69.4)
    _, verdicts = judge(waits, [c, s])
    assert verdicts == [("ok", 1), ("hol", 64), ("ok", 1)]  # a classic gap holds its own token
    assert waits[1].by == "spec" and waits[1].allowance == 5


def test_a_lump_read_just_after_the_gap_still_counts_on_client_arrivals():
    """The client read the classic token first although the server sent the lump 5 ms earlier."""
    classic = [0.0, 5.0, 805.0, 810.0]
    spec = [807.0] * 64
    c, s = stream("classic", classic), stream("spec", spec, kind="spec")
    _, verdicts = judge(stalls.waits_of(c, 69.4), [c, s])
    assert verdicts[1] == ("hol", 63)  # 800 of the 807 ms in which the lump may have been made lie in the gap


def test_only_one_arrival_after_the_gap_counts_so_a_fast_stream_resuming_is_not_blamed():
    classic = [0.0, 100.0]
    fast = [101.0 + i for i in range(9)]  # the other stream resumes at 1 token/ms after the same freeze
    c, f = stream("classic", classic), stream("fast", fast)
    _, verdicts = judge(stalls.waits_of(c, 50.0), [c, f], stalls.Rule(tokens_per_round=1))
    assert verdicts == [("noise", 1)]


def test_a_reply_held_back_and_sent_in_one_lump_is_charged_to_its_own_ttft():
    spec = [1200.0] * 96
    s = stream("spec", spec, spec, kind="spec")
    c = stream("classic", [0.0, 5.0, 1205.0], [0.0, 5.0, 1205.0])
    waits = [stalls.Wait(s, 0, 72.0)]
    _, verdicts = judge(waits, [c, s])
    assert verdicts == [("hol", 96)] and waits[0].by == "spec"


def test_a_serializing_server_is_charged_for_the_ttft_it_makes_wait():
    classic = [10.0 + 5 * i for i in range(128)]
    spec_times = [classic[-1] + 5 + 30 * i for i in range(10)]
    c, s = stream("classic", classic), stream("spec", spec_times, kind="spec", sent_ms=40.0)
    _, verdicts = judge([stalls.Wait(s, 0, 100.0)], [c, s], stalls.Rule(tokens_per_round=1))
    assert verdicts[0][0] == "hol" and verdicts[0][1] > 100


def test_pending_requests_widen_the_allowance():
    classic = [0.0, 300.0]
    spec = [100.0] * 4 + [200.0] * 4 + [290.0] * 4  # three rounds of one request in one gap
    c, s = stream("classic", classic, classic), stream("spec", spec, spec, kind="spec")
    assert judge([stalls.Wait(c, 1, 69.4)], [c, s])[1] == [("hol", 12)]
    assert judge([stalls.Wait(c, 1, 69.4, rounds=2)], [c, s])[1] == [("noise", 12)]


def test_charged_percentile_and_the_printed_rule():
    classic, spec = slice_schedule(n=200, freeze_after=50, freeze_ms=200.0)
    c, s = stream("classic", classic, classic), stream("spec", spec, spec, kind="spec")
    waits = stalls.waits_of(c, 57.5)
    line = stalls.judge(waits, [c, s], RULE)
    assert stalls.charged_percentile(waits, 100) == 57.5
    text = RULE.describe(line)
    assert "A = 1 x R 4 + 1 = 5 tokens" in text and "tick timeline" in text
    assert "4 + 1 + 4 = 9 tokens" in RULE.describe(stalls.CLIENT)


def test_streams_survive_the_trip_to_a_locust_master():
    s = stream("spec", [1.0, 1.0, 2.0], [0.5, 0.5, 1.5], kind="spec", sent_ms=0.2)
    assert stalls.Stream.from_json(s.to_json()) == s
    t = stream("classic", [1.0])
    assert stalls.Stream.from_json(t.to_json()) == t


def test_on_client_arrivals_a_fast_stream_may_keep_its_pace_for_the_wait_limit():
    """A frozen reader reads the other stream's buffered events at once; up to the wait's limit at that
    stream's own pace is not a block, a whole serialized reply is."""
    classic = [0.0, 150.0]
    fast = [2.0 + 3.0 * i for i in range(20)] + [150.0] * 30  # 3 ms per token, then 30 buffered events
    c, f = stream("classic", classic), stream("fast", fast)
    paced = stalls.Rule(tokens_per_round=1, pace_ms=stalls.pace_ms([stream("alone", [3.0 * i for i in range(1, 10)])]))
    assert paced.pace_ms == 3.0
    # 50 tokens in the 150 ms wait are its pace (150 / 3); the 30 read at once are a lump 29 ahead of
    # it, over A 3 + 40% of the 50-token reply
    waits = [stalls.Wait(c, 1, 60.0)]
    assert judge(waits, [c, f], paced)[1] == [("hol", 29)] and waits[0].measure == "lump"
    paced_along = stream("fast", [-88.0 + 3.0 * i for i in range(48)], sent_ms=-100.0)  # 18 of its 48 in the wait
    assert judge([stalls.Wait(c, 1, 60.0)], [c, paced_along], paced)[1] == [("noise", 18)]
    # ... and so is a whole reply at its pace: a stalled connection looks the same (only a lump is a burst)
    whole = stream("fast", [2.0 + 3.0 * i for i in range(18)])
    assert judge([stalls.Wait(c, 1, 60.0)], [c, whole], paced)[1] == [("noise", 18)]
    assert "may hold at most A + 40% of that stream's reply beyond its pace" in paced.describe(stalls.CLIENT)
    bunched = stream("alone", [3.0, 3.01, 3.02, 12.0, 12.01, 12.02, 21.0])  # events read in bunches: the mean counts
    assert stalls.pace_ms([bunched]) == 3.0


def test_a_frozen_reader_reads_every_streams_backlog_at_once_and_that_is_noise():
    """The client stalled 100 ms while the server kept streaming both: the other stream's backlog is
    read inside the classic wait, but the classic stream's own backlog ends it (it was served too)."""
    classic = [2.5 * i for i in range(20)] + [150.0 + 0.01 * i for i in range(40)]
    spec = [2.0 * i for i in range(25)] + [149.8 + 0.002 * i for i in range(50)]
    c, s = stream("classic", classic), stream("spec", spec, kind="spec")
    paced = stalls.Rule(tokens_per_round=1, pace_ms=2.0)
    waits = [stalls.Wait(c, 20, 60.0)]
    assert judge(waits, [c, s], paced)[1] == [("noise", 50 - 39)]
    assert waits[0].caught_up == 40 and waits[0].to_json()["caught_up_tokens"] == 40
    held = stream("classic", [2.5 * i for i in range(20)] + [150.0 + 2.5 * i for i in range(40)])  # then its pace
    assert judge([stalls.Wait(held, 20, 60.0)], [held, s], paced)[1] == [("hol", 48)]  # its lump, 48 ahead


def test_a_backlog_made_before_a_wait_is_not_evidence_against_it():
    """A stream stalled, then its backlog arrived 1 ms into another request's TTFT: made before the wait."""
    spec = [2.0 * i for i in range(15)] + [190.0 + 0.01 * i for i in range(49)]
    newcomer = stream("classic", [300.0, 302.0], sent_ms=189.0)
    s = stream("spec", spec, kind="spec")
    waits = [stalls.Wait(newcomer, 0, 86.5)]
    assert judge(waits, [newcomer, s], stalls.Rule(tokens_per_round=1, pace_ms=2.0))[1] == [("noise", 1)]


# -- servers that report nothing: the pace comes from a stream's whole life ------------------------------
def burst_behind_a_silent_server():
    """The legacy burst on client arrivals: classic tokens every 5 ms, then the speculative request's
    whole 96-token reply in one lump 1000 ms after it was sent, inside one classic gap."""
    classic = [5.0 * i for i in range(1, 9)] + [1045.0 + 5.0 * i for i in range(8)]
    spec = [1040.0 + 0.01 * i for i in range(96)]
    return stream("classic", classic, sent_ms=0.0), stream("spec", spec, kind="spec", sent_ms=40.0)


def test_a_reply_that_arrived_in_one_lump_alone_paces_at_its_whole_life():
    alone = stream("spec", [1000.0 + 0.01 * i for i in range(96)], kind="spec", sent_ms=0.0)
    assert stalls.pace_ms([alone]) == pytest.approx(1000.95 / 96)  # sent -> last token, not 0.01 ms a token
    split = stream("spec", [1000.0 + 0.6 * i for i in range(96)], kind="spec")  # the lump split under load
    assert stalls.pace_ms([split]) == pytest.approx(1057.0 / 96)
    classic_alone = stream("classic", [5.0 * i for i in range(1, 129)])
    assert stalls.paces_by_kind([alone, classic_alone]) == (("classic", 5.0),
                                                            ("spec", pytest.approx(10.427, abs=0.001)))


def test_the_legacy_burst_fails_behind_a_server_that_reports_nothing():
    c, s = burst_behind_a_silent_server()
    alone = stream("spec", [1000.0 + 0.01 * i for i in range(96)], kind="spec")
    waits = stalls.waits_of(c, 40.0)
    rule = stalls.Rule(tokens_per_round=1, pace_ms=stalls.pace_ms([alone]))
    _, verdicts = judge(waits, [c, s], rule)
    gap = waits[7]  # token 8: the gap the whole reply arrived in
    assert gap.index == 8 and gap.ms == 1005.0 and gap.verdict == "hol" and gap.by == "spec"
    # the 96 tokens arrived in 0.95 ms, 94 ahead of 10.4 ms a token (less the classic's 3 caught up),
    # against A 3 + 40% of 96; counted, they are the pace of its whole 1005 ms and would be noise
    assert gap.measure == "lump" and gap.evidence == 91 and gap.allowance == 1 + 1 + 1 + 39
    assert [v for v, _ in verdicts].count("hol") == 1
    # planted: the pace of the old rule (first to last token of the lump) calls the lump its pace
    lump_pace = (alone.arrivals_ns[-1] - alone.arrivals_ns[0]) / 1e6 / 95
    old = stalls.Rule(tokens_per_round=1, pace_ms=lump_pace)
    waits = stalls.waits_of(c, 40.0)
    stalls.judge(waits, [c, s], old)
    assert waits[7].verdict == "noise"
    assert old.allowance(stalls.CLIENT, limit_ms=40.0) > 3900  # and what it excused by count


def test_each_kind_is_excused_at_its_own_pace():
    """A fast classic stream's pace does not excuse a slower speculative stream's tokens."""
    c, s = burst_behind_a_silent_server()
    rule = stalls.Rule(tokens_per_round=1, pace_ms=0.5, paces=(("classic", 0.5), ("spec", 10.0)))
    waits = stalls.waits_of(c, 40.0)
    stalls.judge(waits, [c, s], rule)
    assert waits[7].verdict == "hol" and waits[7].by == "spec" and waits[7].allowance == 3 + 39
    assert rule.allowance(stalls.CLIENT, limit_ms=40.0, kind="spec") == 3 + 4
    assert rule.allowance(stalls.CLIENT, limit_ms=40.0, kind="classic") == 3 + 80
    assert rule.allowance(stalls.CLIENT, limit_ms=40.0, kind="other") == 3 + 80  # unknown kind: pace_ms
    assert rule.allowance(stalls.SERVER, limit_ms=40.0, kind="spec") == 2  # the tick timeline needs no pace


def test_slice_alternation_behind_a_silent_server_is_not_charged_even_when_frozen():
    """Slice mode on client arrivals: a classic token, then a round of 4 read as one lump; the reader
    froze 150 ms once and read both backlogs at once: noise, at the paces measured alone."""
    classic, spec = [], []
    for i in range(1, 40):
        shift = 150.0 if i >= 20 else 0.0
        classic.append((35.0 * i + shift) if i != 20 else 35.0 * 20 + 150.0)
        spec += [35.0 * i - 5 + shift + 0.01 * k for k in range(4)]
    spec = sorted(t if not (35.0 * 19 < t < 35.0 * 20 + 150) else 35.0 * 20 + 149.9 for t in spec)
    c, s = stream("classic", classic), stream("spec", spec, kind="spec", sent_ms=25.0)
    rule = stalls.Rule(tokens_per_round=4, paces=(("classic", 5.5), ("spec", 11.0)))
    waits = stalls.waits_of(c, 65.0)
    line, verdicts = judge(waits, [c, s], rule)
    assert line == stalls.CLIENT and all(v != "hol" for v, _ in verdicts)
    assert sum(v == "noise" for v, _ in verdicts) >= 1


def test_a_fast_stream_resuming_after_a_burst_is_not_a_catch_up():
    """At 0.3 ms a token the classic stream's tokens after the burst arrive under 0.5 ms apart: with
    the lump at a quarter of its own pace they are its next tokens, not a backlog that excuses the burst."""
    classic = [0.5 * i for i in range(1, 21)] + [110.0 + 0.35 * i for i in range(60)]
    spec = [109.0 + 0.01 * i for i in range(96)]
    c, s = stream("classic", classic), stream("spec", spec, kind="spec", sent_ms=5.0)
    paced = stalls.Rule(tokens_per_round=1, paces=(("classic", 0.5), ("spec", 1.0)))
    waits = stalls.waits_of(c, 40.0)
    stalls.judge(waits, [c, s], paced)
    gap = waits[19]
    # its 60 next tokens at 0.35 ms are 18 ahead of its 0.5 ms pace: what a bunched read may have held
    assert gap.ms == 100.0 and gap.caught_up == 18 and gap.verdict == "hol" and gap.evidence == 95 - 18
    # planted: a pace-blind lump of 0.5 ms takes its 60 next tokens for a catch-up and calls the burst noise
    blind = stalls.Rule(tokens_per_round=1, paces=(("classic", 4.0), ("spec", 1.0)))
    waits = stalls.waits_of(c, 40.0)
    stalls.judge(waits, [c, s], blind)
    assert waits[19].caught_up == 60 and waits[19].verdict == "noise"
    assert stalls.lump_ns(0.5) == 125_000 and stalls.lump_ns(None) == stalls.lump_ns(40.0) == 500_000


def test_a_catch_up_offsets_only_what_was_read_with_it():
    """Under load the classic stream's tokens after a burst reached the client 50 ms after the burst's
    lump, as one backlog: a frozen reader reads every backlog at once, so that catch-up does not excuse
    a lump read long before it (on a frozen reader both arrive together: test above)."""
    classic = [10.0, 100.0] + [420.0 + 0.01 * i for i in range(42)] + [425.0 + 2.0 * i for i in range(20)]
    spec = [367.0 + 0.01 * i for i in range(96)]
    c, s = stream("classic", classic), stream("spec", spec, kind="spec", sent_ms=43.0)
    rule = stalls.Rule(tokens_per_round=1, paces=(("classic", 0.68), ("spec", 2.0)))
    waits = stalls.waits_of(c, 118.0)
    stalls.judge(waits, [c, s], rule)
    gap = waits[1]
    # 96 x 267 / 324 of the lump in the gap, none of it offset (was 79 - 41 = 38, against 35 allowed)
    assert gap.caught_up == 42 and gap.verdict == "hol" and gap.evidence == 94 and gap.measure == "lump"
    together = stream("spec", [419.0 + 0.01 * i for i in range(96)], kind="spec", sent_ms=43.0)  # read with it
    waits = stalls.waits_of(c, 118.0)
    stalls.judge(waits, [c, together], rule)
    assert waits[1].evidence == 94 - 41  # the catch-up offsets what was read with it (96 vs 42: still a lump)


def test_a_ttft_may_hold_a_fast_stream_at_its_pace_beyond_a_third_of_its_reply():
    """A request's TTFT includes the server's admission path; a fast classic stream streaming at its
    pace meanwhile is not a burst (a gap holding as much would be: the cap holds in gaps)."""
    classic = [0.6 * i for i in range(1, 129)]
    newcomer = stream("spec", [57.0, 58.0], kind="spec", sent_ms=5.0)
    c = stream("classic", classic)
    rule = stalls.Rule(tokens_per_round=1, paces=(("classic", 0.6), ("spec", 1.0)))
    ttft = [stalls.Wait(newcomer, 0, 50.0)]
    stalls.judge(ttft, [c, newcomer], rule)
    assert ttft[0].evidence == 87 and ttft[0].verdict == "noise" and ttft[0].allowance == 3 + 84
    # planted: as many tokens in a gap are capped at 40% of the reply
    waiting = stream("waiting", [4.0, 60.0], kind="classic", sent_ms=3.0)  # a classic gap
    gap = [stalls.Wait(waiting, 1, 50.0)]
    stalls.judge(gap, [c, waiting], rule)
    assert gap[0].verdict == "noise"  # ... and in a gap too: a stream at its pace is no lump
    lump = stream("lump", [59.0 + 0.01 * i for i in range(60)], kind="spec", sent_ms=3.0)  # planted: at once
    gap = [stalls.Wait(waiting, 1, 50.0)]
    stalls.judge(gap, [lump, waiting], rule)
    assert gap[0].verdict == "hol" and gap[0].measure == "lump" and gap[0].allowance == 3 + 24


def test_one_connection_stalled_while_the_other_streamed_at_its_pace_is_noise_in_a_gap():
    """Measured under load 11 behind a proxy: the classic stream's delivery stalled 430 ms while the
    speculative stream kept arriving at its own pace (11 ms a token). In a gap the pace counts for the
    whole wait (up to a third of the reply); counted for the 61 ms limit only, it was charged."""
    classic = [35.0 * i for i in range(1, 10)] + [745.0 + 0.02 * i for i in range(11)]
    spec = [25.0 + 11.0 * i for i in range(96)]
    c, s = stream("classic", classic), stream("spec", spec, kind="spec", sent_ms=20.0)
    rule = stalls.Rule(tokens_per_round=1, paces=(("classic", 5.5), ("spec", 11.1)))
    waits = stalls.waits_of(c, 61.0)
    stalls.judge(waits, [c, s], rule)
    gap = waits[8]
    # 430 / 10.9 (its own pace in the run, faster than 11.1 alone) = 40
    assert gap.ms == 430.0 and gap.verdict == "noise" and gap.allowance == 3 + 40
    assert rule.allowance(stalls.CLIENT, limit_ms=61.0, kind="spec") == 3 + 6 < gap.evidence


def test_a_speculative_stream_waiting_while_the_classic_one_streams_at_its_pace_is_not_capped():
    """Measured with locust at fast costs, load 11: a 59 ms gap of the speculative stream in which the
    classic one got 64 of its 128 tokens at its own pace. The question is whether classic streams
    stall: only their gaps cap another stream's pace at 40% of its reply."""
    classic = [0.9 * i for i in range(1, 129)]
    spec = [1.0, 2.0, 61.0, 62.0]
    c, s = stream("classic", classic), stream("spec", spec, kind="spec")
    rule = stalls.Rule(tokens_per_round=1, paces=(("classic", 0.65), ("spec", 0.94)))
    waits = [stalls.Wait(s, 2, 53.0)]
    stalls.judge(waits, [c, s], rule)
    assert waits[0].evidence == 66 and waits[0].verdict == "noise" and waits[0].allowance == 3 + 91
    as_classic = stream("classic", spec, kind="classic")  # planted: the same gap of a classic stream
    other = stream("spec", classic, kind="spec")
    waits = [stalls.Wait(as_classic, 2, 53.0)]
    stalls.judge(waits, [other, as_classic], rule)
    assert waits[0].verdict == "noise"  # the classic stream at its pace is no lump either
    lumped = stream("spec", [1.0 + 0.001 * i for i in range(64)] + [61.0 + 0.001 * i for i in range(64)], kind="spec")
    waits = [stalls.Wait(as_classic, 2, 53.0)]
    stalls.judge(waits, [lumped, as_classic], rule)  # planted: its 64 tokens at once in the gap
    assert waits[0].verdict == "hol" and waits[0].measure == "lump"


def test_a_catch_up_that_ends_the_waiting_reply_is_not_charged_for_a_lump_after_it():
    """Measured with locust at load 10, slice mode: the reader froze 198 ms; then the classic stream's
    last 4 tokens and a whole 64-token speculative reply were read within 5 ms. The classic stream was
    served in full during the wait; the other reply, made after its last token, is no block of it."""
    classic = [2.0 * i for i in range(1, 125)] + [446.7 + 0.05 * i for i in range(4)]
    spec = [447.0 + 0.07 * i for i in range(64)]
    c, s = stream("classic", classic), stream("spec", spec, kind="spec", sent_ms=227.0)
    rule = stalls.Rule(tokens_per_round=1, paces=(("classic", 0.82), ("spec", 1.25)))
    waits = [stalls.Wait(c, 124, 40.0)]
    stalls.judge(waits, [c, s], rule)
    assert waits[0].caught_up == 4 and waits[0].verdict == "noise" and waits[0].measure == "count"
    # planted: the same lump while the classic stream goes on is a burst
    going_on = stream("classic", classic + [460.0 + 2.0 * i for i in range(20)])
    waits = [stalls.Wait(going_on, 124, 40.0)]
    stalls.judge(waits, [going_on, s], rule)
    assert waits[0].verdict == "hol" and waits[0].measure == "lump" and waits[0].evidence > 50
