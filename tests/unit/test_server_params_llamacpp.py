"""llama.cpp's server params from what llama-server reports and counts (planted answers)."""

from __future__ import annotations

import pytest

from harness.calibrate.server_params import llamacpp
from harness.calibrate.server_params.context import context_slope, mean_cached
from harness.calibrate.server_params.llamacpp import (
    draft_cap,
    frontend_overhead,
    llamacpp_reported,
    prompt_fixed,
    queue_wake,
    step_ms,
)
from harness.calibrate.server_params.stall import arrival_stall, stall_probe
from harness.live.client import Arrival, Collected
from mocks import CostModel

PROPS = {"total_slots": 4, "default_generation_settings": {"n_ctx": 1024}}
SLOTS = [{"id": i, "speculative": True, "n_ctx": 1024} for i in range(4)]


@pytest.mark.parametrize("props, slots, params", [
    pytest.param(PROPS, SLOTS, {"parallel": 4, "draft_model": True}, id="draft"),
    pytest.param(PROPS, [{**s, "speculative": False} for s in SLOTS], {"parallel": 4, "draft_model": False},
                 id="no-draft"),
    pytest.param({"total_slots": 2}, None, {"parallel": 2}, id="no-slots-endpoint"),
    pytest.param(None, None, {}, id="nothing-reported"),
])
def test_what_the_server_reports_becomes_params(props, slots, params):
    fitted, evidence = llamacpp_reported(props, slots)
    assert fitted == params
    assert any("batch_size" in line and "not reported" in line for line in evidence)


@pytest.mark.parametrize("drafts, tokens, cap", [
    pytest.param(28, 81, 3, id="n-max-3-tail-cut"),   # measured: a 64-token request at --spec-draft-n-max 3
    pytest.param(10, 50, 5, id="every-round-full"),
    pytest.param(30, 31, 2, id="one-round-over"),
])
def test_the_draft_cap_is_the_mean_draft_rounded_up(drafts, tokens, cap):
    assert draft_cap(drafts, tokens)[0] == cap


def test_no_drafts_keep_the_default():
    cap, line = draft_cap(0, 0)
    assert cap is None and "counted no drafts" in line


def test_frontend_time_is_the_least_gap_so_a_busy_core_does_not_move_it():
    ms, line = frontend_overhead([(3.0, 2.0), (2.9, 1.8), (160.0, 2.0), (3.2, 2.0), (2.5, 1.4)])
    assert ms == pytest.approx(1.0) and "160.00" not in line and "158.00" in line


@pytest.mark.parametrize("predicted, rounds, ms", [
    pytest.param([(47.0, 48), (94.0, 48)], None, 1.5, id="decode-steps-after-the-first-token"),
    pytest.param([(40.0, 48), (60.0, 48)], 20.0, 2.5, id="rounds-with-a-draft-model"),
    pytest.param([(5.0, 1), (47.0, 48)], None, 1.0, id="a-lone-token-has-no-step"),
])
def test_a_step_is_the_servers_generation_time_over_its_steps(predicted, rounds, ms):
    assert step_ms(predicted, rounds) == pytest.approx(ms)


# -- the step costs: a planted server whose step grows with what its rows have cached ------------
BASE_MS = {1: 0.25, 2: 0.45, 3: 0.62, 4: 0.60}  # a step's price by rows, before the rows' attention
CACHED_MS = 0.0013                       # ms per cached token per row


class PlantedServer:
    """Answers each pass of `together` as a llama-server whose decode step at B rows costs
    BASE_MS[B] + CACHED_MS x the rows' cached tokens (one token per prompt character)."""
    url, context_tokens = "http://planted", 1024

    def __init__(self, cached_ms: float = CACHED_MS) -> None:
        self.cached_ms = cached_ms

    def body(self, prompt: str, max_tokens: int, speculative: bool) -> dict:
        return {"prompt": prompt, "max_tokens": max_tokens}

    def together(self, bodies):
        rows, outs = len(bodies), []
        for body in bodies:
            n, cached = body["max_tokens"], len(body["prompt"]) + (body["max_tokens"] - 2) / 2
            step = BASE_MS[rows] + self.cached_ms * rows * cached
            arrivals = [Arrival(int(i * step * 1e6), 1, None, "x", None, None, {}) for i in range(n)]
            arrivals[-1].event = {"timings": {"predicted_ms": (n - 1) * step, "predicted_n": n,
                                              "prompt_n": len(body["prompt"]), "cache_n": 0}}
            outs.append(Collected(0, arrivals))
        return outs


def fit_steps(monkeypatch, server):
    monkeypatch.setattr(llamacpp.client, "try_scrape", lambda url: None)  # no /metrics: no drafts counted
    return llamacpp.llamacpp_costs(server, False, 3)


def test_the_steps_are_priced_by_width_plus_what_their_rows_have_cached(monkeypatch):
    costs, evidence = fit_steps(monkeypatch, PlantedServer())
    assert costs["context_per_token_ms"] == pytest.approx(CACHED_MS, rel=1e-3)
    assert costs["decode_ms"] == [[b, pytest.approx(ms, abs=1e-3)] for b, ms in BASE_MS.items()]
    assert any(line.startswith("context_per_token_ms = 0.001300") for line in evidence)


def test_a_server_whose_step_ignores_the_cache_gets_no_context_term(monkeypatch):
    costs, _ = fit_steps(monkeypatch, PlantedServer(cached_ms=0.0))
    assert costs["context_per_token_ms"] == 0.0
    assert costs["decode_ms"] == [[b, pytest.approx(ms, abs=1e-4)] for b, ms in BASE_MS.items()]


def priced_at(costs: dict, cached: int) -> float:
    cost = CostModel(decode_ms=costs["decode_ms"], context_per_token_ms=costs["context_per_token_ms"])
    return cost.decode(1) + cost.context(cached)


def test_a_held_out_cache_is_priced_where_the_width_only_fit_came_out_cheap(monkeypatch):
    """A lone row at 130 cached tokens (the held-out's prompts): the fit prices it; without the long
    prompt's probe (the fit before), the short probes carry only their own 39 tokens: ~28% cheap."""
    live = BASE_MS[1] + CACHED_MS * 130
    assert priced_at(fit_steps(monkeypatch, PlantedServer())[0], 130) == pytest.approx(live, rel=0.01)
    monkeypatch.setattr(llamacpp, "LONG_ROWS", ())
    assert priced_at(fit_steps(monkeypatch, PlantedServer())[0], 130) < 0.75 * live


@pytest.mark.parametrize("short, long, positions, slope", [
    pytest.param((0.25, 39.0), (0.90, 539.0), 1, 0.0013, id="decode"),
    pytest.param((1.80, 39.0), (8.00, 539.0), 4, 0.0031, id="four-verify-positions"),
    pytest.param((0.30, 39.0), (0.25, 539.0), 1, 0.0, id="noise-never-negative"),
    pytest.param((0.30, 39.0), (0.90, 39.0), 1, 0.0, id="no-longer-cache"),
])
def test_the_context_slope_is_per_cached_token_and_position(short, long, positions, slope):
    assert context_slope(short, long, positions) == pytest.approx(slope)


def test_a_rows_mean_cache_is_its_prompt_and_half_its_later_steps():
    assert mean_cached(16, 48) == 39.0 and mean_cached(16, 1) == 16.0


@pytest.mark.parametrize("fixed, frontend, want", [
    pytest.param(1.95, 1.03, {"prefill_fixed_ms": 0.92}, id="less-the-frontend"),
    pytest.param(0.80, 1.50, {"prefill_fixed_ms": 0.0}, id="never-negative"),
    pytest.param(1.95, 0.0, {}, id="no-frontend-measured"),
])
def test_the_prompt_forward_is_not_charged_the_frontend(fixed, frontend, want):
    said: list[str] = []
    assert prompt_fixed({"prefill_fixed_ms": fixed}, frontend, said) == want
    assert len(said) == len(want)


def test_a_three_row_step_is_timed_not_drawn_between_two_and_four(monkeypatch):
    """llama-server's 3-row step costs about what 4 rows do (0.53 against 0.49 ms, measured), over the
    line from 2 to 4 rows (0.385): a point at every width the slots can hold."""
    costs, _ = fit_steps(monkeypatch, PlantedServer())
    cost = CostModel(decode_ms=costs["decode_ms"])
    assert cost.decode(3) == pytest.approx(BASE_MS[3], abs=1e-3)
    assert cost.decode(3) > (BASE_MS[2] + BASE_MS[4]) / 2 + 0.05


@pytest.mark.parametrize("passes, join, want", [
    pytest.param([(100.0, 124.0, 8), (101.0, 130.0, 8), (99.0, 123.0, 8)], 1.5, 1.5, id="excess-over-the-join"),
    # measured: the server's work per arrival grew between passes (its prompt cache fills up)
    pytest.param([(179.27, 189.64, 8), (184.81, 267.31, 8), (213.05, 265.59, 8)], 2.129, 4.4385,
                 id="paired-not-pooled"),
    pytest.param([(100.0, 104.0, 8)], 1.0, 0.0, id="joins-cost-what-the-twin-charges"),
    # measured 2026-12-07: 2.6 ms more with 8 arrivals 10 ms apart, 3 of them before a 35 ms stream's end
    pytest.param([(35.32, 37.93, 3)], 0.562, 0.308, id="only-the-arrivals-that-landed"),
])
def test_an_arrivals_stall_is_the_streams_excess_less_its_priced_prompt(passes, join, want):
    # the median over passes of (with - alone) / arrivals during the stream, less the join
    ms, line = arrival_stall(passes, join)
    assert ms == pytest.approx(want, abs=1e-3) and f"{join:.3f} ms the twin charges" in line


class StallServer:
    """A llama-server whose stream costs `step_ms` a token, stretched by `stall_ms` for each request
    sent before its last token (a one-token arrival's whole work); an arrival after it costs nothing."""
    url = "http://planted"

    def __init__(self, step_ms: float, stall_ms: float) -> None:
        self.step_ms, self.stall_ms = step_ms, stall_ms

    def body(self, prompt: str, max_tokens: int, speculative: bool) -> dict:
        return {"prompt": prompt, "max_tokens": max_tokens}

    def together(self, bodies, offsets=None):
        offsets = list(offsets or [0.0] * len(bodies))
        end = bodies[0]["max_tokens"] * self.step_ms
        for off in sorted(offsets[1:]):
            end += self.stall_ms if off < end else 0.0
        n = bodies[0]["max_tokens"]
        stream = [Arrival(int(end * (i + 1) / n * 1e6), 1, None, "x", None, None, {}) for i in range(n)]
        stream[-1].event = {"timings": {"predicted_ms": end, "predicted_n": n}}
        arrivals = [Collected(int(off * 1e6), [Arrival(int((off + 1) * 1e6), 1, None, "x", None, None, {
            "timings": {"prompt_n": 16, "predicted_n": 1}})]) for off in offsets[1:]]
        return [Collected(0, stream), *arrivals]


@pytest.mark.parametrize("step_ms", [pytest.param(0.1, id="fast-stream"), pytest.param(1.0, id="slow-stream")])
def test_the_stall_probe_spreads_its_arrivals_over_the_stream(step_ms):
    # a 0.1 ms step makes a 25.6 ms stream: arrivals 10 ms apart would mostly come after it, and a
    # probe dividing by all 8 read 2 x 0.9 / 8 = 0.225 ms an arrival, under the join: a stall of 0
    cost = CostModel()
    join = cost.prefill_batch([(16, False)])
    ms, line = stall_probe(StallServer(step_ms, join + 0.9), cost, False)
    assert ms == pytest.approx(0.9, abs=1e-3) and "with 8 arrived" in line


def test_no_timed_stream_gives_no_stall():
    assert arrival_stall([], 1.0)[0] == 0.0
    assert arrival_stall([(35.0, 35.0, 0)], 1.0)[0] == 0.0  # every arrival came after the stream


@pytest.mark.parametrize("passes, want", [
    # medians 1.01, 1.36, 1.72 ms a token: 29.6 us a queued request, over the 4 tokens a step sends
    pytest.param([(0, 1.00), (0, 1.02), (12, 1.36), (24, 1.72)], 0.71 / 24 / 4, id="linear"),
    pytest.param([(0, 1.02), (12, 1.01), (24, 1.00)], 0.0, id="a-queue-that-costs-nothing"),
])
def test_a_tokens_wake_is_the_queues_slope_over_the_tokens_a_step_sends(passes, want):
    ms, line = queue_wake(passes, 4)
    assert ms == pytest.approx(want, abs=1e-5) and "with 24 queued" in line


def test_streams_never_timed_with_a_queue_give_no_wake():
    ms, line = queue_wake([(0, 1.0), (0, 1.01)], 4)
    assert ms == 0.0 and "not timed both with and without" in line


# -- accept_prob over many prompts, from the server's own counters -------------------------------------
class CountingServer:
    """Every lone speculative request drafts 30 tokens and has `accepted` of them accepted (/metrics)."""
    url = "http://accept"

    def __init__(self, accepted: float, counts: bool = True) -> None:
        self.accepted, self.counts, self.sent = accepted, counts, []
        self.totals = {"llamacpp:spec_decode_num_drafts_total": 0.0, "llamacpp:spec_decode_num_draft_tokens_total": 0.0,
                       "llamacpp:spec_decode_num_accepted_tokens_total": 0.0}

    def body(self, prompt, max_tokens, speculative):
        return {"prompt": prompt, "max_tokens": max_tokens, "speculative": speculative}

    def collect(self, url, body, **_):
        self.sent.append(body)
        self.totals["llamacpp:spec_decode_num_drafts_total"] += 10
        self.totals["llamacpp:spec_decode_num_draft_tokens_total"] += 30
        self.totals["llamacpp:spec_decode_num_accepted_tokens_total"] += self.accepted
        return Collected(0, [])

    def scrape(self, url):
        return dict(self.totals) if self.counts else {"llamacpp:spec_decode_num_drafts_total": 0.0}


@pytest.mark.parametrize("accepted", [0.0, 15.0, 30.0])
def test_the_acceptance_is_the_accepted_share_of_every_probes_drafts(accepted, monkeypatch):
    from harness.calibrate import fit

    server = CountingServer(accepted)
    monkeypatch.setattr(llamacpp.client, "collect", server.collect)
    monkeypatch.setattr(llamacpp.client, "try_scrape", server.scrape)
    p, line = llamacpp.acceptance(server, 3)
    # the share accepted, as tokens a round at K = 4: 1 + share x 3
    assert p == pytest.approx(fit.acceptance_from_tokens(1 + accepted / 30 * 3, 4), abs=1e-4)
    assert len(server.sent) == llamacpp.ACCEPT_PROBES and all(b["speculative"] for b in server.sent)
    lengths = sorted({len(b["prompt"]) for b in server.sent})
    assert (lengths[0], lengths[-1]) == llamacpp.ACCEPT_CHARS and len(lengths) > 10  # spread over the served lengths
    assert f"{llamacpp.ACCEPT_PROBES} lone requests" in line


def test_a_server_counting_no_acceptance_keeps_the_timing_fits(monkeypatch):
    server = CountingServer(10.0, counts=False)
    monkeypatch.setattr(llamacpp.client, "collect", server.collect)
    monkeypatch.setattr(llamacpp.client, "try_scrape", server.scrape)
    p, line = llamacpp.acceptance(server, 3)
    assert p is None and "timing fit's is kept" in line


def test_a_slow_spell_of_the_machine_moves_no_widths_step_price(monkeypatch):
    """The step passes are interleaved across widths: four slow passes in a row (the machine's speed
    moves for seconds at a time) lengthen one pass of each width, and no width's median moves. Done
    width by width, the same spell took three of B=2's five passes."""
    calls = []

    def timed(server, rows, chars, speculates, key):
        calls.append(rows)
        ms = 0.1 * rows * (2.0 if 5 <= len(calls) <= 8 else 1.0)
        return ms, ms, 40.0

    monkeypatch.setattr(llamacpp, "_timed", timed)
    measured = llamacpp._measured(None, (1, 2, 3, 4), 16, False)
    assert {rows: round(m[1], 6) for rows, m in measured.items()} == {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4}
    assert calls[:8] == [1, 2, 3, 4, 1, 2, 3, 4]
