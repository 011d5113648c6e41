"""A server gone cold (idle_wake_ms), in virtual time: a request sent after the engine sat idle
reaches it later by the table's extra at that idle (0 at none, linear between the points, the last
beyond them and before the first step); one sent while the engine is in a step pays none. And the
fitter's table from lone requests' TTFTs. Each rule has a planted regression."""

from __future__ import annotations

import pytest
from plants import caught

from coopsched.core import SchedulerConfig
from coopsched.twins.base import idle_extra_ms, idle_table
from harness.calibrate.server_params import idle
from harness.run import runner, shared_core
from harness.run.scenario import RequestSpec, Scenario
from mocks import CostModel

# a prompt of 4 tokens costs 2 ms, a decode step 4; frontend 1 ms, and after 10 ms idle 2 more, after 20 ms 4
COST = CostModel(prefill_fixed_ms=0.0, prefill_per_token_ms=0.5, decode_ms=[[1, 4.0], [2, 4.0]])
WAKE = [[10.0, 2.0], [20.0, 4.0]]


def ttfts(b_at: float, wake=WAKE) -> dict[str, float]:
    """a (4-token prompt, 2 tokens) sent at 0, b (4-token prompt, 1 token) sent at `b_at`."""
    scenario = Scenario("cold", requests=(RequestSpec("a", 0.0, 4, max_tokens=2),
                                          RequestSpec("b", b_at, 4, max_tokens=1)))
    params = {"frontend_ms": 1.0, "idle_wake_ms": wake}
    run = runner.execute(runner.priced(scenario, runner.Profile(COST, "llama.cpp", params)),
                         SchedulerConfig(has_drafter=False))
    return {r.id: run.token_times[r.id][0] - r.arrival_ms for r in run.requests}


def test_the_first_request_finds_the_server_cold():
    # a: no step before it, so the table's last extra: seen at 1 + 4, its prompt 5-7
    assert ttfts(60.0)["a"] == 7.0
    assert ttfts(60.0, wake=[])["a"] == 3.0


@pytest.mark.parametrize("b_at, ttft", [
    pytest.param(26.0, 6.0, id="idle-15"),   # a's last step ended at 11: 15 ms idle, 3 ms more
    pytest.param(16.0, 4.0, id="idle-5"),    # 5 ms idle: 1 ms more (from 0 at no idle to 2 at 10)
    pytest.param(111.0, 7.0, id="idle-100"),  # past the last point: its 4 ms
])
def test_a_request_sent_after_the_server_sat_idle_is_seen_later(b_at, ttft):
    assert ttfts(b_at)["b"] == ttft
    assert ttfts(b_at, wake=[])["b"] == 3.0


def test_a_request_sent_while_the_engine_steps_pays_no_idle_wake():
    # a (cold: seen at 5) prompts 5-7 and decodes 7-11; b sent at 9, in that step: seen at 10, its prompt 11-13
    assert ttfts(9.0)["b"] == 4.0


@pytest.mark.parametrize("idle_ms, extra", [(0.0, 0.0), (5.0, 1.0), (10.0, 2.0), (15.0, 3.0), (20.0, 4.0),
                                             (1e9, 4.0), (float("inf"), 4.0)])
def test_the_extra_is_linear_between_the_points(idle_ms, extra):
    assert idle_extra_ms(idle_table("llama.cpp", "idle_wake_ms", WAKE), idle_ms) == extra
    assert idle_extra_ms((), idle_ms) == 0.0


@pytest.mark.parametrize("value", ["ab", 3, [[5]], [[5, 1, 2]], [[5, 1], [5, 2]], [[20, 1], [10, 2]],
                                   [[-1, 0]], [[1, True]], [[1, "2"]]])
def test_a_bad_table_is_refused_naming_it(value):
    with pytest.raises(ValueError, match=r"server_params idle_wake_ms=.*\[idle ms, extra ms\] pairs"):
        idle_table("llama.cpp", "idle_wake_ms", value)


def test_the_fitter_reads_the_median_beyond_straight_after_another():
    table, line = idle.idle_wake({0.0: [1.0, 1.2, 0.9], 5.0: [1.5, 1.4, 2.0], 20.0: [2.0, 2.1, 2.2]})
    assert table == [[5.0, 0.5], [20.0, 1.1]]
    assert "after 0/5/20 ms idle: 1.00/1.50/2.10 ms" in line


def test_the_fitters_table_never_falls_nor_goes_below_zero():
    table, _ = idle.idle_wake({0.0: [1.0], 2.0: [0.8], 10.0: [2.0], 20.0: [1.5]})
    assert table == [[2.0, 0.0], [10.0, 1.0], [20.0, 1.0]]


def test_no_straight_after_timing_charges_nothing():
    assert idle.idle_wake({0.0: [], 5.0: [1.5]}) == (
        [], "idle_wake_ms: no lone request was timed straight after another; none is charged")


# -- planted regressions: the rule removed, the tables above must fail -------------------------------
def _idle_ignored(mp):
    mp.setattr(shared_core, "idle_extra_ms", lambda table, idle_ms: 0.0)


def _idle_from_step_start(mp):
    """Idle counted from the last step's start, not its end."""
    def idle_for(self, t_ms):
        i = shared_core.bisect_right(self.starts, t_ms) - 1
        return t_ms - self.starts[i] if i >= 0 else float("inf")
    mp.setattr(shared_core.BusyClock, "idle_for", idle_for)


def _idle_in_step(mp):
    """The idle extra charged whatever the engine was doing at the send (the last point's)."""
    mp.setattr(shared_core.FrontendArrivals, "_extra", lambda self, request: self.idle_wake[-1][1])


def _no_running_max(mp):
    mp.setattr(idle, "accumulate", lambda values, _max: values)


PLANTS = {
    "idle-ignored": (_idle_ignored, lambda: test_a_request_sent_after_the_server_sat_idle_is_seen_later(26.0, 6.0)),
    "idle-from-step-start": (_idle_from_step_start,
                             lambda: test_a_request_sent_after_the_server_sat_idle_is_seen_later(26.0, 6.0)),
    "idle-charged-in-a-step": (_idle_in_step, test_a_request_sent_while_the_engine_steps_pays_no_idle_wake),
    "first-request-warm": (_idle_ignored, test_the_first_request_finds_the_server_cold),
    "fitted-table-falls": (_no_running_max, test_the_fitters_table_never_falls_nor_goes_below_zero),
}


test_planted_regression_is_caught = caught(PLANTS)
