"""The frontend sharing the engine's core (frontend_stall_ms: vLLM's twin, and the reference), in
virtual time: each arrival's frontend work holds the core from its send, so a forward it overlaps
ends that much later; the engine idle, it delays nothing but the request (frontend_ms). A request
sent while the engine is in a step reaches it frontend_busy_ms later still. Each rule has a planted
regression."""

from __future__ import annotations

import pytest
from plants import caught

from coopsched.core import SchedulerConfig
from harness.run import runner, shared_core
from harness.run.scenario import RequestSpec, Scenario
from mocks import CostModel

COST = CostModel(prefill_fixed_ms=0.0, prefill_per_token_ms=0.5, decode_ms=[[1, 4.0], [2, 4.0]])


def execute(stall: float, frontend: float = 3.0, *, b_at: float = 9.0, busy: float = 0.0) -> runner.Run:
    """a (4-token prompt, 6 tokens) from 0, b (4-token prompt, 1 token) sent at `b_at`."""
    scenario = Scenario("stall", requests=(RequestSpec("a", 0.0, 4, max_tokens=6),
                                           RequestSpec("b", b_at, 4, max_tokens=1)))
    params = {"frontend_ms": frontend, "frontend_stall_ms": stall, "frontend_busy_ms": busy}
    return runner.execute(runner.priced(scenario, runner.Profile(COST, "vllm", params)),
                          SchedulerConfig(has_drafter=False))


def token_times(stall: float, frontend: float = 3.0, *, b_at: float = 9.0, busy: float = 0.0) -> dict[str, list[float]]:
    return execute(stall, frontend, b_at=b_at, busy=busy).token_times


def test_the_forward_an_arrival_overlaps_is_stretched_by_its_stall():
    # a: seen at 3 (its own frontend's 3 ms over before), prompt 3-5, decodes 5-9, 9-13; b sent at 9
    # takes 3 ms of the core from 9, so that forward ends at 16
    plain, stalled = token_times(0.0), token_times(3.0)
    assert plain["a"][:3] == [5.0, 9.0, 13.0]
    assert stalled["a"][:3] == [5.0, 9.0, 16.0]
    assert [t + 3.0 for t in plain["a"][2:]] == stalled["a"][2:]  # every later step 3 ms later, no more
    assert stalled["b"][0] - plain["b"][0] == 3.0


def test_an_idle_engine_is_not_stalled():
    # a has finished by 40: b's frontend work runs while the engine waits for b (frontend_ms 5 > stall 3)
    assert token_times(3.0, 5.0, b_at=40.0) == token_times(0.0, 5.0, b_at=40.0)


def test_a_request_sent_while_the_engine_steps_is_seen_busy_ms_later():
    # b sent at 9, as a's step 9-13 begins: seen at 12 it joins at 13 (13-19: its prompt beside a's
    # decode); 5 ms more, seen at 17, it waits for the step 13-17 to end and runs 17-23
    assert token_times(0.0)["b"] == [19.0]
    run = execute(0.0, busy=5.0)
    assert run.token_times["b"] == [23.0] and run.token_times["a"][:4] == [5.0, 9.0, 13.0, 17.0]
    assert run.by_id("b").arrival_ms == 9.0  # its TTFT counts from the client's send


def test_a_request_sent_to_an_idle_engine_takes_frontend_ms_only():
    # a sent to an idle engine (at 0), and b after a has finished (at 40): neither waits more
    assert token_times(0.0, b_at=40.0, busy=5.0) == token_times(0.0, b_at=40.0)


def test_busy_spans_queue_behind_each_other():
    assert shared_core.busy_spans([10.0, 12.0, 40.0], 5.0) == [(10.0, 20.0), (40.0, 45.0)]
    assert shared_core.busy_spans([], 5.0) == []


@pytest.mark.parametrize("start, work, end", [
    (0.0, 5.0, 5.0),     # ends before the frontend's first span
    (0.0, 12.0, 22.0),   # 10 ms, then the span (10, 20), then the 2 ms left
    (11.0, 1.0, 21.0),   # begun inside a span: waits it out
    (30.0, 20.0, 55.0),  # 10 ms, the span (40, 45), 10 ms
    (50.0, 3.0, 53.0),   # after every span
])
def test_a_forward_ends_after_its_work_and_the_spans_it_overlaps(start, work, end):
    assert shared_core.stretched_end([(10.0, 20.0), (40.0, 45.0)], start, work) == end


# -- planted regressions: the rule removed, the tables above must fail -------------------------------
def _no_stretch(mp):
    mp.setattr(shared_core, "stretched_end", lambda spans, start, work: start + work)


def _stall_when_idle(mp):
    """Every arrival's stall charged to the first forward after its send, even one begun after it is over."""
    charged: set = set()

    def stretched(spans, start, work):
        due = [s for s in spans if s[0] < start + work and s not in charged]
        charged.update(due)
        return start + work + sum(e - b for b, e in due)
    mp.setattr(shared_core, "stretched_end", stretched)


def _no_queueing(mp):
    mp.setattr(shared_core, "busy_spans", lambda sends, stall: [(s, s + stall) for s in sorted(sends)])


def _busy_ignored(mp):
    mp.setattr(shared_core.FrontendArrivals, "_extra", lambda self, request: 0.0)


def _busy_always(mp):
    mp.setattr(shared_core.FrontendArrivals, "_extra", lambda self, request: self.busy_ms)


PLANTS = {
    "busy-frontend-ignored": (_busy_ignored, test_a_request_sent_while_the_engine_steps_is_seen_busy_ms_later),
    "busy-frontend-when-idle": (_busy_always, test_a_request_sent_to_an_idle_engine_takes_frontend_ms_only),
    "stall-ignored": (_no_stretch, test_the_forward_an_arrival_overlaps_is_stretched_by_its_stall),
    "idle-engine-stalled": (_stall_when_idle, test_an_idle_engine_is_not_stalled),
    "spans-overlap": (_no_queueing, test_busy_spans_queue_behind_each_other),
}


test_planted_regression_is_caught = caught(PLANTS)


def test_the_reference_twin_is_stretched_by_an_arrivals_stall_too():
    # coopsched serve's event loop shares the engine's core when pinned: a seen at 3, prompt 3-5,
    # decodes 5-9 and 9-13, stretched to 9-16 by b's HTTP work from its send at 9; b's own admit tick
    # (2 ms of prompt) then runs 16-18 instead of 13-15
    def token_times(stall: float) -> dict[str, list[float]]:
        scenario = Scenario("stall", requests=(RequestSpec("a", 0.0, 4, max_tokens=6),
                                               RequestSpec("b", 9.0, 4, max_tokens=1)))
        profile = runner.Profile(COST, "coopsched", {"frontend_ms": 3.0, "frontend_stall_ms": stall})
        return runner.execute(runner.priced(scenario, profile), SchedulerConfig(has_drafter=False)).token_times

    plain, stalled = token_times(0.0), token_times(3.0)
    assert plain == {"a": [5.0, 9.0, 13.0, 19.0, 23.0, 27.0], "b": [15.0]}
    assert stalled == {"a": [5.0, 9.0, 16.0, 22.0, 26.0, 30.0], "b": [18.0]}
