"""`coopsched sweep`'s rules on hand-made data: the capacity rule, a point's figures under the
per-token SLO, the /metrics deltas of a --target point, and the load lists it accepts."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from harness.run.slo import RequestTiming, Slo, meets, miss_reason, violations
from harness.sweep import live
from harness.sweep.cli import live_columns, parse_loads
from harness.sweep.points import SweepError, Timed, capacity, figures


def pts(mode: str, attainments: dict) -> list[dict]:
    """Points of one mode: {load: [attainment per seed]}."""
    return [{"mode": mode, "load": load, "seed": seed, "slo_attainment": a}
            for load, seeds in attainments.items() for seed, a in enumerate(seeds)]


CAPACITY = [  # id, {load: attainment per seed}, threshold, capacity
    ("all-hold", {2: [1.0], 4: [0.95], 8: [0.9]}, 0.9, 8),
    ("knee", {2: [1.0], 4: [0.95], 8: [0.5]}, 0.9, 4),
    ("a-dip-caps-below-it", {2: [1.0], 4: [0.7], 6: [0.99], 8: [0.99]}, 0.9, 2),
    ("all-below", {2: [0.5], 4: [0.4]}, 0.9, None),
    ("lowest-below-higher-above", {2: [0.8], 4: [1.0]}, 0.9, None),
    ("mean-over-seeds", {2: [1.0, 0.8], 4: [1.0, 0.75]}, 0.9, 2),  # 0.9 holds, 0.875 does not
    ("one-bad-seed-sinks-a-load", {2: [1.0, 1.0, 0.6]}, 0.9, None),
    ("exact-threshold-holds", {2: [0.9, 0.9, 0.9]}, 0.9, 2),  # fsum / 3 lands a hair under 0.9
    ("unsorted-points", {8: [1.0], 2: [1.0], 4: [0.2]}, 0.9, 2),
    ("no-attainment-counts-zero", {2: [1.0], 4: [None]}, 0.9, 2),
    ("fractional-loads", {0.5: [1.0], 1.5: [0.95], 2.5: [0.1]}, 0.9, 1.5),
    ("threshold-zero", {2: [0.0], 4: [0.0]}, 0.0, 4),
]


@pytest.mark.parametrize(("attainments", "threshold", "want"), [c[1:] for c in CAPACITY], ids=[c[0] for c in CAPACITY])
def test_capacity_rule(attainments, threshold, want):
    assert capacity(pts("slice", attainments), threshold) == {"slice": want}


def test_capacity_is_per_mode_in_point_order():
    points = pts("burst", {2: [0.5], 4: [0.1]}) + pts("slice", {2: [1.0], 4: [0.95]})
    assert capacity(points, 0.9) == {"burst": None, "slice": 4}


# -- a point's figures ----------------------------------------------------------------------
def timed(rid: str, arrival: float, times: list[float], speculative: bool = False, error: str | None = None):
    return Timed(rid, arrival, times, speculative, error)


def test_one_stall_misses_even_with_a_small_mean_gap():
    """Per token, never a mean: 99 gaps of 10 ms and one of 300 ms average 12.9 ms, and miss 100 ms."""
    stalled = [10.0 * i for i in range(50)] + [490.0 + 300.0] + [790.0 + 10.0 * i for i in range(1, 50)]
    smooth = [10.0 * i for i in range(100)]
    got = figures([timed("a", 0.0, stalled), timed("b", 0.0, smooth)], Slo(itl_ms=100.0))
    assert (got["slo_attainment"], got["met"]) == (0.5, 1)
    assert got["slo_misses"] == {"ttft": 0, "itl": 1, "failed": 0}
    assert got["classic_itl_max_ms"] == 300.0 and got["classic_itl_p50_ms"] == 10.0


def test_classic_figures_leave_speculative_requests_out_and_the_slo_counts_everyone():
    reqs = [timed("c", 0.0, [5.0, 10.0, 15.0]),                     # classic: gaps 5, 5
            timed("s", 0.0, [40.0, 40.0, 40.0, 80.0], speculative=True),  # a round of 3, then 1: gaps 0, 0, 40
            timed("late", 10.0, [1010.0, 1020.0]),                   # TTFT 1000
            timed("dead", 20.0, [], error="model_error")]
    got = figures(reqs, Slo(itl_ms=30.0, ttft_ms=500.0))
    assert got["requests"] == 4 and got["met"] == 1  # c only: s has a 40 ms gap, late its TTFT, dead failed
    assert got["slo_misses"] == {"ttft": 1, "itl": 1, "failed": 1}
    assert got["slo_attainment"] == 0.25
    assert (got["classic_itl_p50_ms"], got["classic_itl_max_ms"]) == (5.0, 10.0)  # c's and late's gaps
    assert got["itl_p99_ms"] == pytest.approx(38.5)  # every gap pooled: 0, 0, 5, 5, 10, 40
    assert got["span_s"] == 1.02 and got["goodput_rps"] == round(1 / 1.02, 6)  # first arrival -> last token
    assert got["ttft_p50_ms"] == 40.0  # of 5, 40, 1000 (the failed request has none)
    assert got["aggregate_tok_s"] == round(1000 * 9 / 1020, 6) and got["spec_tok_s"] == 50.0


def test_violations_agree_with_judge_miss_reasons():
    slo = Slo(itl_ms=50.0, ttft_ms=100.0)
    cases = [RequestTiming("ok", 20.0, (10.0, 50.0)), RequestTiming("gap", 20.0, (51.0,)),
             RequestTiming("ttft", 101.0, ()), RequestTiming("both", 101.0, (60.0,)),
             RequestTiming("none", None), RequestTiming("err", 1.0, (), error="boom")]
    assert [violations(slo, r) for r in cases] == [(), ("itl",), ("ttft",), ("ttft", "itl"), ("failed",), ("failed",)]
    assert [meets(slo, r) for r in cases] == [miss_reason(slo, r) is None for r in cases]


# -- /metrics deltas --------------------------------------------------------------------------
BEFORE = """# HELP coopsched_spec_rounds_total Speculative rounds executed
# TYPE coopsched_spec_rounds_total counter
coopsched_spec_rounds_total 10.0
# TYPE coopsched_spec_rounds_created gauge
coopsched_spec_rounds_created 1.79e+09
# TYPE coopsched_itl_seconds histogram
coopsched_itl_seconds_bucket{kind="classic",le="0.001"} 3.0
coopsched_itl_seconds_count{kind="classic"} 4.0
coopsched_itl_seconds_sum{kind="classic"} 0.02
coopsched_itl_seconds_count{kind="spec"} 1.0
coopsched_itl_seconds_sum{kind="spec"} 0.03
# TYPE coopsched_requests_running gauge
coopsched_requests_running 2.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="m, with } brace"} 1.0
"""
AFTER = BEFORE.replace("_total 10.0", "_total 25.0").replace('_count{kind="spec"} 1.0', '_count{kind="spec"} 5.0') \
    .replace("running 2.0", "running 7.0") + "# TYPE coopsched_new counter\ncoopsched_new_total 2 1700000000\n"


def test_metrics_delta_counts_counters_and_histogram_count_and_sum_with_labels_folded():
    before, after = live.counted_samples(BEFORE), live.counted_samples(AFTER)
    assert before == {"coopsched_spec_rounds_total": 10.0, "coopsched_itl_seconds_count": 5.0,
                      "coopsched_itl_seconds_sum": 0.05, "vllm:num_preemptions_total": 1.0}
    assert live.delta(before, after) == {"coopsched_itl_seconds_count": 4.0, "coopsched_itl_seconds_sum": 0.0,
                                         "coopsched_new_total": 2.0, "coopsched_spec_rounds_total": 15.0,
                                         "vllm:num_preemptions_total": 0.0}
    assert live.delta(None, after) is None and live.delta(before, None) is None
    assert live.delta({"x_total": 9.0}, {"x_total": 4.0}) == {"x_total": 4.0}  # a drop: the server restarted


LLAMA_CPP = """# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 192
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 70
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
"""


def test_llama_cpp_counters_are_counted_and_shown_per_rung():
    """llama-server names its families with `_total` on the TYPE line; its gauges are not deltas."""
    counted = live.counted_samples(LLAMA_CPP)
    assert counted == {"llamacpp:tokens_predicted_total": 192.0, "llamacpp:spec_decode_num_drafts_total": 70.0}
    sweep = {"summary": {"external": [{"metrics_delta": counted}, {"metrics_delta": None}]}}
    assert live_columns(sweep) == [("llamacpp:spec_decode_num_drafts_total", "drafts")]
    assert [label for _, label in live_columns({"summary": {"slice": [{"metrics_delta": {}}]}})] == \
        ["rounds", "slices"]
    assert live_columns({"summary": {"slice": [{"load": 1}]}}) == []  # virtual time: no live columns


# -- load lists ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("option", "text", "want"), [
    ("--rates", "8, 2,4.5", (2, 4.5, 8)), ("--rates", "+1,.5", (0.5, 1)), ("--concurrency", "4,1,2", (1, 2, 4))],
    ids=["sorted-whole-stay-ints", "plus-and-leading-dot", "users"])
def test_loads_parse(option, text, want):
    loads = parse_loads(option, text)
    assert loads == want and [type(x) for x in loads] == [type(x) for x in want]


@pytest.mark.parametrize(("option", "text"), [("--rates", "1e3"), ("--rates", "nan"), ("--concurrency", "２"),
                                              ("--concurrency", "2.0")],
                         ids=["exponent", "nan", "full-width-digit", "decimal-users"])
def test_loads_refuse_what_is_not_plain(option, text):
    with pytest.raises(SweepError, match=f"{option} item"):
        parse_loads(option, text)


# -- the closed-loop driver of --target ---------------------------------------------------------
class CountingTarget:
    """A stand-in server: each stream takes ~2 ms of wall time; records how many were in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_flight = self.most = 0
        self.spans: dict[str, tuple[float, float]] = {}

    def stream(self, body: dict, out, origin_ns: int) -> None:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
        start = (time.perf_counter_ns() - origin_ns) / 1e6
        time.sleep(0.002)
        out.sent_ms, out.token_times_ms, out.finish_reason = start, [start + 1.0], "length"
        with self.lock:
            self.in_flight -= 1
            self.spans[out.spec.id] = (start, (time.perf_counter_ns() - origin_ns) / 1e6)


@pytest.mark.parametrize("users", [1, 3], ids=["one-user", "three-users"])
def test_closed_loop_driver_keeps_at_most_its_users_in_flight(users):
    from harness.run.scenario import RequestSpec

    specs = [RequestSpec(f"w{i:04d}", max_tokens=4) for i in range(9)]
    target = CountingTarget()
    outs = live.run_closed(target, specs, {s.id for s in specs}, users, 0.0, 0, None)
    assert [o.spec.id for o in outs] == [s.id for s in specs] and all(o.finish_reason for o in outs)
    assert target.most <= users and len(target.spans) == 9
    if users == 1:  # one user: each request starts after the previous one ended
        spans = [target.spans[s.id] for s in specs]
        assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))
