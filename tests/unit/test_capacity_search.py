"""The capacity search of `calibrate --report` in virtual time: a fake live runner whose attainment is
a function of the rate brackets a known capacity, bisects it to 10%, stops at its rung bound, halves
down (never under the light rate) when it starts too high, and says a capacity is only a bound when
no rate missed. A fake server with one FIFO queue shows what the short ladder alone cannot: 32
requests arrive too fast to wait 2 s, the search's rungs do."""

from __future__ import annotations

import pytest

from harness.calibrate import heldout, search
from harness.run.slo import Slo
from harness.sweep.points import Timed

SLO = Slo(itl_ms=250, ttft_ms=2000)


def meets_up_to(capacity: float, twin_capacity: float | None = None):
    """A rung's runner: live meets the SLO (every request) at rates <= capacity, none above; the twin
    likewise at its own capacity."""
    def run(rate: float, requests: int) -> search.Step:
        attained = {"live": 1.0 if rate <= capacity else 0.5}
        if twin_capacity is not None:
            attained["twin"] = 1.0 if rate <= twin_capacity else 0.5
        return search.Step(rate, requests, requests / rate, requests / rate, attained)
    return run


def run_search(capacity: float, start: float = 2.0, floor: float = 1.0, rungs: int = 12, lines=None):
    return search.search(meets_up_to(capacity, 0.8 * capacity), start, floor, SLO, 32, rungs,
                         heldout.DEFAULT_ATTAINMENT, lambda _: None, (lines if lines is not None else []).append)


def found(steps):
    return heldout.capacity([], SLO, steps=steps)


@pytest.mark.parametrize("capacity", [pytest.param(13.0, id="between-doublings"),
                                      pytest.param(16.0, id="on-a-doubling"),
                                      pytest.param(2.5, id="just-past-the-start")])
def test_the_search_brackets_a_known_capacity_and_bisects_it(capacity):
    steps = run_search(capacity)
    rates = [s.rate_per_s for s in steps]
    first_miss = next(i for i, s in enumerate(steps) if not s.met("live", 0.9))
    assert rates[:first_miss + 1] == [2.0 * 2 ** i for i in range(first_miss + 1)], rates  # doubling
    cap = found(steps)
    assert cap["live"] <= capacity < cap["missed"] and cap["missed"] / cap["live"] - 1 <= search.RESOLUTION, cap
    low, high = rates[first_miss - 1], rates[first_miss]
    assert all(low < r < high for r in rates[first_miss + 1:]) and len(rates) > first_miss + 1, rates  # bisected
    assert cap["top_rate_is_a_bound"] is False and cap["bounds"] == {"live": False, "twin": False}, cap
    assert cap["twin"] <= 0.8 * capacity and cap["error"] < 0, cap  # the slower twin's own capacity, its error


def test_the_search_stops_at_its_bound_and_then_says_the_capacity_is_a_bound():
    lines: list[str] = []
    steps = run_search(100.0, rungs=3, lines=lines)
    cap = found(steps)
    assert [s.rate_per_s for s in steps] == [2.0, 4.0, 8.0] and len(lines) == 3, lines
    assert cap["live"] == 8.0 and cap["missed"] is None and cap["top_rate_is_a_bound"] is True, cap
    assert cap["bounds"] == {"live": True, "twin": True} and "at least 8 req/s" in heldout.capacity_line(cap)
    assert lines[0].startswith("capacity rung 1/3: 2 req/s, 32 requests") and "live 100% met" in lines[0], lines


def test_a_start_that_misses_halves_down_to_the_floor_and_no_lower():
    steps = run_search(3.0, start=16.0, floor=2.0)
    rates = [s.rate_per_s for s in steps]
    assert rates[:4] == [16.0, 8.0, 4.0, 2.0] and min(rates) == 2.0, rates
    cap = found(steps)
    assert cap["live"] <= 3.0 < cap["missed"] and cap["top_rate_is_a_bound"] is False, cap
    never = found(run_search(1.0, start=4.0, floor=2.0))
    assert never["live"] is None and never["rates"] == [4.0, 2.0] and never["top_rate_is_a_bound"] is False, never


def test_a_twin_far_below_the_live_server_gets_its_own_capacity_not_the_light_rate():
    """Live capacity 13, the twin's 3: of the live search's rates the twin meets only the first (2)
    and misses the next (4), so on those rates alone its capacity reads 2; its own search bisects
    2-4 on the twin alone until the bracket is within RESOLUTION, around the true 3."""
    steps = search.search(meets_up_to(13.0, 3.0), 2.0, 1.0, SLO, 32, 12, heldout.DEFAULT_ATTAINMENT,
                          lambda _: None, lambda _: None)
    assert found(steps)["twin"] == 2.0
    twin = lambda rate, requests: 1.0 if rate <= 3.0 else 0.5
    more = search.refine(twin, "twin", steps, 1.0, SLO, 32, 12, heldout.DEFAULT_ATTAINMENT)
    cap = heldout.capacity([], SLO, steps=steps, refined={"twin": more})
    above = min(s.rate_per_s for s in more if s.rate_per_s > 3.0)
    assert cap["twin"] <= 3.0 < above and above / cap["twin"] - 1 <= search.RESOLUTION, cap
    assert all(2.0 < s.rate_per_s < 4.0 for s in more) and cap["live"] == found(steps)["live"], cap
    assert [r["rate_per_s"] for r in cap["twin_search"]["twin"]] == [s.rate_per_s for s in more]


def test_no_rungs_is_no_search():
    assert run_search(13.0, rungs=0) == []


@pytest.mark.parametrize("rate, slo, requests", [
    pytest.param(10.0, SLO, 80, id="arrivals-span-4x-the-ttft-bound"),
    pytest.param(1.0, SLO, 32, id="never-fewer-than-the-ladder"),
    # 256 requests at 300/s (the old bound) arrived in 0.85 s: a burst a server of 80/s absorbed
    pytest.param(300.0, SLO, 2400, id="a-fast-servers-rung-spans-8s-too"),
    pytest.param(1000.0, SLO, search.MAX_RUNG_REQUESTS, id="bounded"),
    pytest.param(10.0, Slo(itl_ms=250), 80, id="no-ttft-bound-8s"),
])
def test_a_rung_has_enough_requests_for_a_queue_past_the_ttft_bound(rate, slo, requests):
    assert search.rung_requests(rate, slo, 32) == requests


# -- through the whole held-out check: a server with one FIFO queue ----------------------------
def fifo(service_ms: float):
    """A fake server: one request at a time, each `service_ms`, first token when it is done."""
    def run(scen, _run: int = 0, _give_up=None) -> list[Timed]:
        free, out = 0.0, []
        for spec in sorted(scen.specs(heldout.SEED), key=lambda s: s.arrival_ms):
            free = max(free, spec.arrival_ms) + service_ms
            out.append(Timed(spec.id, spec.arrival_ms, [free, free + 1.0, free + 2.0], spec.speculative))
        return out
    return run


def test_the_search_finds_the_queue_the_ladder_cannot():
    """100 ms a request: 10 req/s is the most it serves for long. The ladder stops at 10 req/s (its
    TTFT rose), where 32 requests still meet a 2 s TTFT, so on the ladder alone the capacity is a
    bound at its top rate; the search's rungs, arrivals over 8 s, find where the queue outgrows 2 s
    (12-13 req/s); a twin at 110 ms a request misses one rate sooner."""
    live, twin = fifo(100.0), fifo(110.0)
    lines: list[str] = []
    ladder_only = heldout.check(live, lambda scen, draw=0: twin(scen), 400.0, runs=1, capacity_rungs=0)["capacity"]
    report = heldout.check(live, lambda scen, draw=0: twin(scen), 400.0, runs=1, log=lines.append)
    cap = report["capacity"]
    assert ladder_only["live"] == ladder_only["rates"][-1] == 10.0 and ladder_only["top_rate_is_a_bound"], ladder_only
    assert ladder_only["search"] == [] and ladder_only["missed"] is None, ladder_only
    assert 10.0 < cap["live"] < cap["missed"] <= 14.0 and cap["top_rate_is_a_bound"] is False, cap
    # the twin met 10 and missed 11.892 of the live rates; its own search bisects them in virtual time
    assert cap["twin"] == 10.905 < cap["live"] and cap["error"] == pytest.approx(10.905 / cap["live"] - 1, abs=1e-4)
    assert cap["twin_search"] == {"twin": [{"rate_per_s": 10.905, "requests": 88, "slo_attainment": 1.0}]}, cap
    assert len(cap["search"]) == len(lines) <= search.RUNGS, lines
    assert all(s["requests"] >= search.rung_requests(s["rate_per_s"], SLO, heldout.NUM_REQUESTS) for s in cap["search"])
    assert cap["live_s"] == pytest.approx(sum(s["live_s"] for s in cap["search"]), abs=1e-3)


def test_a_rate_the_search_runs_again_is_judged_on_its_search_rung_only():
    """The search halved back onto a ladder rate: its longer rung, not the ladder's 32 requests, says
    whether that rate met."""
    rung = lambda rate, share: heldout.Rung(rate, {"slo_attainment": share}, True, {"twin": share})
    ladder = [rung(1.0, 1.0), rung(2.0, 1.0), rung(4.0, 1.0)]
    steps = run_search(1.5, start=4.0, floor=1.0, rungs=2)  # 4 misses, then 2 misses
    cap = heldout.capacity(ladder, SLO, steps=steps)
    assert cap["rates"] == [1.0, 4.0, 2.0] and cap["live"] == 1.0 and cap["missed"] == 2.0, cap


def test_a_first_doubling_that_falls_behind_is_bisected_for_the_knee():
    """100 ms a request serves 10/s: from a light rate of 6/s the first doubling (12/s) falls behind,
    so the knee lies between; the ladder tries the geometric midpoints and the knee is the highest
    that kept up, not the 12/s that did not (which put llama-server's knee workload past its
    capacity)."""
    server = fifo(100.0)
    knee, rungs = heldout.ladder(server, {}, 6.0, heldout.NUM_REQUESTS, SLO)
    rates = [r.rate_per_s for r in rungs]
    assert rates[:2] == [6.0, 12.0] and not rungs[1].keeps_up, rates
    assert len(rungs) == 2 + heldout.REFINE_RUNGS and all(6.0 < r < 12.0 for r in rates[2:]), rates
    assert rates[2] == pytest.approx(72 ** 0.5, abs=1e-3)
    kept = [r.rate_per_s for r in rungs[2:] if r.keeps_up]
    assert knee == (max(kept) if kept else min(rates[2:])) and 6.0 < knee < 12.0, (knee, rungs)
    # a ladder whose doublings keep up is not refined: the knee is the last that did
    knee, rungs = heldout.ladder(server, {}, 1.0, heldout.NUM_REQUESTS, SLO)
    assert [r.rate_per_s for r in rungs] == [1.0, 2.0, 4.0, 8.0, 16.0][:len(rungs)] and knee < 10.0
    assert knee == max(r.rate_per_s for r in rungs if r.keeps_up)


# -- giving a hopeless live rung up ----------------------------------------------------------------
@pytest.mark.parametrize("requests, attainment, allowed", [(100, 0.9, 10), (1029, 0.9, 102), (32, 0.9, 3),
                                                         (20, 1.0, 0), (7, 0.5, 3)])
def test_a_rung_may_miss_as_many_as_the_attainment_leaves(requests, attainment, allowed):
    give_up = search.GiveUp.of(SLO, requests, attainment)
    assert give_up is not None and give_up.allowed == allowed
    waited = [2000.0] * requests + [2000.1] * allowed  # at the bound meets it; over it misses
    assert not give_up.hopeless(waited)
    assert give_up.hopeless([*waited, 2500.0])


def test_without_a_ttft_bound_a_rung_is_never_given_up():
    assert search.GiveUp.of(Slo(itl_ms=250), 100, 0.9) is None


def test_a_given_up_rung_says_so_in_its_line_and_json():
    step = search.Step(128.6, 1029, 8.0, 3.1, {"live": 0.41, "twin": 0.33}, gave_up_after=412)
    assert "live 41% missed, given up after 412 sent (took 3.1 s)" in search.step_line(step, 1, 6, 0.9)
    assert step.to_json()["gave_up_after_requests"] == 412
    ran_out = search.Step(64.3, 515, 7.8, 7.8, {"live": 1.0})
    assert "given up" not in search.step_line(ran_out, 2, 6, 0.9) and "gave_up_after_requests" not in ran_out.to_json()


def test_a_search_step_hands_its_live_run_a_way_out():
    seen = []

    def live(scen, run, give_up):
        seen.append(give_up)
        return [Timed(s.id, s.arrival_ms, [s.arrival_ms + 1.0], s.speculative) for s in scen.specs(heldout.SEED)]

    heldout.search_step(live, {}, 10.0, 40, SLO)
    assert seen[0].ttft_ms == 2000 and seen[0].allowed == 4
    heldout.search_step(live, {}, 10.0, 40, Slo(itl_ms=250))
    assert seen[1] is None
