"""The pure parts of mlx_lm.server's calibration: the prefill line (each length's fastest, the stalls
pooled, the longest length left out past linear), first tokens grouped into steps, a round priced
from lone streams like served ones; and the twin priced by the fitted terms, in virtual time."""

from __future__ import annotations

import numpy as np
import pytest

from coopsched.core import SchedulerConfig
from harness.calibrate import fit, heldout, twin
from harness.calibrate.server_params import mlxlm
from harness.calibrate.server_params.mlxlm import cluster_sizes, prefill_line, round_from_streams, waves_of
from harness.run.runner import Profile
from harness.run.scenario import RequestSpec, Scenario
from mocks import CostModel

LENGTHS = (16, 64, 256, 1024)


def ttft(x: float) -> float:
    return 5.0 + 0.3 * x + 0.001 * x * x  # attention makes long prompts cost more than linearly


def record(points):
    return {"prefill": {"points": [[x, y, 0.0] for x, y in points]}}


def test_the_prefill_line_prices_short_prompts_as_measured():
    points = [(x, ttft(x)) for x in LENGTHS for _ in range(3)]
    cost, evidence = prefill_line(record(points), {"decode": [1.0, 1.0]})
    line = lambda x: cost["prefill_fixed_ms"] + cost["prefill_per_token_ms"] * x
    assert line(40) == pytest.approx(ttft(40), rel=0.25)
    assert cost["jitter_quantiles"]["decode"] == [1.0, 1.0]  # other terms' spread kept
    assert "relative error" in evidence["prefill"]["says"]
    # the least-squares line it replaces (calibrate --target's) misses the same prompt by far more
    plain = fit.LinearFit.of(*zip(*points))
    assert abs(max(plain(40), 0.0) / ttft(40) - 1) > 0.5


WORK = lambda x: 4.0 + 0.2 * x  # a lone prompt's TTFT up to 256 tokens; 1024 tokens cost 3x the line
QUIET = [(x, WORK(x) * (3.0 if x == 1024 else 1.0)) for x in LENGTHS for _ in range(3)]


def line_of(cost):
    return lambda x: cost["prefill_fixed_ms"] + cost["prefill_per_token_ms"] * x


def test_a_quiet_server_s_prefill_is_its_work_with_no_spread():
    """Lone TTFTs without noise, past linear at 1024 tokens: the line is the short prompts' work, and no
    spread is drawn (a line bent to reach 1024 tokens left every length a residual taken for noise)."""
    cost, evidence = prefill_line(record(QUIET), {"prefill": [0.5, 1.5], "decode": [0.9, 1.1]})
    assert line_of(cost)(40) == pytest.approx(WORK(40), rel=0.01)
    assert line_of(cost)(192) == pytest.approx(WORK(192), rel=0.01)
    assert cost["jitter_quantiles"] == {"decode": [0.9, 1.1]}  # the timing fit's prefill spread went with its line
    assert "1024-token prompts" in evidence["prefill"]["says"] and "left out" in evidence["prefill"]["says"]


def test_a_stalled_request_is_not_a_price():
    """One of a length's three requests met a neighbour's stall (8x), at two lengths: every length is
    still priced at its work, and the stall is reported, not replayed."""
    stalled = [(x, y * 8.0 if x in (64, 256) and i % 3 == 1 else y) for i, (x, y) in enumerate(QUIET)]
    cost, evidence = prefill_line(record(stalled), {})
    for x in (16, 64, 256):
        assert line_of(cost)(x) == pytest.approx(WORK(x), rel=0.01)
    assert cost["jitter_quantiles"] is None
    assert "1.00-8.0x" in evidence["prefill"]["says"]


def test_a_probe_s_prompt_tokenizes_to_one_length_give_or_take_a_few_tokens():
    groups = mlxlm.lengths_of([(15, 1.0), (16, 1.0), (18, 1.0), (63, 2.0), (64, 2.0), (252, 3.0), (255, 3.0)])
    assert [len(ys) for _, ys in groups] == [3, 2, 2]


def light_ttft_p50(cost: CostModel) -> float:
    """TTFT p50 of calibrate --report's light held-out workload on the mlx-lm twin at these costs."""
    scen = heldout.workload(heldout.light_rate(heldout.solo_life_ms(cost)))
    timed = twin.simulate_timed(Profile(cost, "mlx-lm", {"wave_ms": 500.0}), SchedulerConfig(), scen, heldout.SEED)
    return float(np.percentile([t.token_times_ms[0] - t.arrival_ms for t in timed], 50))


def test_the_twin_priced_by_the_fitted_line_reads_a_quiet_server_s_ttft_p50():
    """The twin at the fitted line and spread against the twin at the server's true work: the light
    workload's TTFT p50 within 5% (the line and spread it replaces read it 12% low here)."""
    true = CostModel(prefill_fixed_ms=4.0, prefill_per_token_ms=0.2, decode_ms=[[1, 2.2], [8, 4.0]])
    fitted, _ = prefill_line(record(QUIET), {})
    p50 = light_ttft_p50(CostModel(**{**true.to_json(), **fitted}))
    assert p50 == pytest.approx(light_ttft_p50(true), rel=0.05)


def test_a_negative_fixed_cost_becomes_a_line_through_the_origin():
    cost, _ = prefill_line(record([(16, 2.0), (64, 20.0), (256, 90.0)]), {})
    assert cost["prefill_fixed_ms"] == 0.0 and cost["prefill_per_token_ms"] > 0


@pytest.mark.parametrize(("times", "sizes"), [
    ([], []),
    ([0.0, 0.1, 0.2, 5.0, 5.1, 10.0], [3, 2, 1]),
    ([0.0, 0.4, 0.8, 1.2], [4]),
], ids=["none", "three-steps", "one-step"])
def test_first_tokens_group_into_steps(times, sizes):
    assert cluster_sizes(times, 0.5) == sizes


# -- the round under a draft model: priced from streams like served ones ----------------------------
# a server whose round grows with the cache its positions read (the context term): the long serialized
# stream (600 tokens) runs at 4.9 ms a token here, a held-out request at about 3.8, as measured
SERVER = CostModel(prefill_fixed_ms=4.0, prefill_per_token_ms=0.6, draft_prefill_per_token_ms=0.0,
                   decode_ms=[[1, 4.0]], draft_per_token_ms=0.0, round_ms=[[4, 6.5]], verify_ms=[[1, 6.5], [4, 6.5]],
                   context_per_token_ms=0.0035, accept_prob=0.58)
DRAFT = {"draft_model": True}


def streams(cost: CostModel, prompt_len: int, max_tokens: int, seeds=range(3)) -> list[float]:
    """ms a token after the first of lone requests on the mlx-lm twin with a draft model, one a seed."""
    scen = Scenario("probe", requests=(RequestSpec("a", prompt_len=prompt_len, max_tokens=max_tokens),))
    out = []
    for seed in seeds:
        (t,) = twin.simulate_timed(Profile(cost, "mlx-lm", DRAFT), SchedulerConfig(), scen, seed)
        out.append((t.token_times_ms[-1] - t.token_times_ms[0]) / (len(t.token_times_ms) - 1))
    return out


def probe(cost: CostModel) -> dict:
    """What stream_probe reads from a server serving at these costs (12 streams a length: the mock
    drafter's acceptance is drawn, a real server's a function of the prompt)."""
    return {"points": [[p, n, p, n, y] for p in mlxlm.STREAM_PROMPTS for n in mlxlm.STREAM_BUDGETS
                       for y in streams(cost, p, n, range(12))]}


def heldout_itl(cost: CostModel) -> float:
    """Mean ITL of calibrate --report's light held-out workload on the mlx-lm twin with a draft model."""
    scen = heldout.workload(1.973)
    timed = twin.simulate_timed(Profile(cost, "mlx-lm", DRAFT), SchedulerConfig(), scen, heldout.SEED)
    return float(np.mean([b - a for t in timed for a, b in zip(t.token_times_ms, t.token_times_ms[1:])]))


def check_heldout_itl(terms: dict) -> None:
    """The twin priced by `terms` serves the held-out workload's tokens as fast as the server does."""
    fitted = CostModel(**{**SERVER.to_json(), **terms})
    assert heldout_itl(fitted) == pytest.approx(heldout_itl(SERVER), rel=0.05)


def test_a_round_is_priced_from_lone_streams_like_served_ones():
    long_itl = float(np.mean(streams(SERVER, 16, 600)))
    terms, says = round_from_streams(probe(SERVER), {"long_itl_ms": long_itl}, SERVER.to_json())
    assert terms["context_per_token_ms"] > 0 and "long stream" in says
    check_heldout_itl(terms)


def test_check_heldout_itl_catches_a_round_priced_from_the_long_stream():
    """What the twin did: a round = the long lone stream's mean gap x the tokens a round emits. Its
    cache held 16 + 300 tokens on average, a held-out request's about 130: 25% slow here."""
    long_itl = float(np.mean(streams(SERVER, 16, 600)))
    round_ms = long_itl * fit.expected_tokens_per_round(0.58, 4)
    with pytest.raises(AssertionError):
        check_heldout_itl({"round_ms": [[4, round_ms]], "verify_ms": [[1, round_ms], [4, round_ms]],
                           "context_per_token_ms": 0.0})


@pytest.mark.parametrize(("per_token", "fixed", "slope"), [
    (lambda x: 1.5 + 0.01 * x, 1.5, 0.01),
    (lambda x: 4.0 - 0.001 * x, None, 0.0),
], ids=["grows-with-the-cache", "falls-flat"])
def test_the_stream_line_is_through_each_length_s_median(per_token, fixed, slope):
    """A stalled stream is not a price (each length's median); a line that falls prices every round
    at the streams' median, no negative context term."""
    cells = [(p, n) for p in mlxlm.STREAM_PROMPTS for n in mlxlm.STREAM_BUDGETS]
    points = [[p, n, p, n, per_token(mlxlm.mean_cached(p, n)) * (3.0 if rep == 0 and i == 0 else 1.0)]
              for rep in range(3) for i, (p, n) in enumerate(cells)]
    terms, says = round_from_streams({"points": points}, {}, {"accept_prob": 0.5})
    assert ("line through them fell" in says) == (fixed is None)
    per_round = 1.875  # 1 + 0.5 + 0.25 + 0.125 tokens a round of K = 4
    ys = [per_token(mlxlm.mean_cached(p, n)) for p, n in cells]
    assert terms["round_ms"] == [[4, pytest.approx((fixed or float(np.median(ys))) * per_round, rel=1e-3)]]
    assert terms["context_per_token_ms"] == pytest.approx(slope * per_round / 4, rel=1e-3, abs=1e-9)
    assert round_from_streams({"points": points}, {}, {"accept_prob": None})[0] == {}


SENT = [100.0 * (i + 1) for i in range(12)]
TTFTS = [514.0, 468.0, 315.0, 210.0, 168.0, 444.0, 358.0, 257.0, 157.0, 57.0, 482.0, 406.0]  # measured


def test_waves_are_where_a_probe_missed_the_wave_its_predecessor_caught():
    """Measured under load: the first wave's last probes came 57 ms apart, which grouping first
    tokens by their gaps took for two waves (wave_ms 390 for a 0.5 s budget)."""
    wave, starts, _ = waves_of(SENT, TTFTS, long_last=5000.0)
    assert starts == [610.0, 1044.0, 1582.0] and wave == pytest.approx(486.0)
    assert waves_of(SENT[:3], [10.0, 12.0, 9.0], long_last=5000.0)[0] == 0.0  # every probe started at once


def test_a_drained_batch_is_not_a_wave():
    """Once the long request ends the batch drains and the next probe starts at once: its TTFT falls,
    so it joins the wave before it rather than starting one."""
    assert waves_of(SENT, TTFTS[:10] + [20.0, 15.0], long_last=1200.0)[0] == pytest.approx(434.0)


# -- the batched path's context term: rows at a short and a long prompt --------------------------------
class RowsServer:
    """B rows decoding together, a token every `base + per_row * B + slope * B * cached` ms, where
    `cached` is a row's prompt (one token a character) and half its tokens; the first pass of each
    is slowed by `stall` (a busy core: the least pass is the price)."""

    def __init__(self, slope: float, base: float = 1.0, per_row: float = 0.3, stall: float = 2.0) -> None:
        self.slope, self.base, self.per_row, self.stall, self.seen = slope, base, per_row, stall, set()

    def body(self, prompt, max_tokens, speculative):
        return {"prompt": prompt, "max_tokens": max_tokens}

    def together(self, bodies):
        from harness.live.client import Arrival, Collected

        rows, chars = len(bodies), len(bodies[0]["prompt"])
        n = bodies[0]["max_tokens"]
        cached = chars + (n - 2) / 2
        step = self.base + self.per_row * rows + self.slope * rows * cached
        step += self.stall if (rows, chars) not in self.seen else 0.0
        self.seen.add((rows, chars))
        usage = {"prompt_tokens": chars}
        return [Collected(0, [Arrival(int((5.0 + step * i) * 1e6), 1, None, "x", None,
                                      usage if i == n - 1 else None, {}) for i in range(n)])
                for _ in bodies]


@pytest.mark.parametrize("slope", [0.0, 0.001, 0.004])
def test_the_batched_paths_context_slope_is_each_rows_least_pass(slope):
    got, cached, evidence = mlxlm.context_probe(RowsServer(slope))
    assert got == pytest.approx(slope, abs=1e-9)
    assert cached == pytest.approx(16 + (mlxlm.CONTEXT_TOKENS - 2) / 2)  # the short rows' prompt and half their tokens
    assert len(evidence["slopes"]) == len(mlxlm.CONTEXT_ROWS)


def test_a_probe_that_timed_nothing_prices_no_context():
    class Silent(RowsServer):
        def together(self, bodies):
            from harness.live.client import Collected
            return [Collected(0, []) for _ in bodies]
    assert mlxlm.context_probe(Silent(0.001))[0] == 0.0


# -- the decode line past the calibration's 8 rows: the concurrency probe's wide step -------------------
def test_the_wide_step_is_each_streams_time_a_token_while_all_rows_decode():
    # 3 streams, one token every 2 ms each while all three decode (5-45 ms), every 1 ms outside that
    a = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] + [5.0 + 2 * i for i in range(1, 21)] + [46.0, 47.0]
    b = [5.0 + 2 * i for i in range(21)]
    c = [5.0 + 2 * i for i in range(10)] + [23.0, 23.0] + [23.0 + 2 * i for i in range(1, 12)]  # a bunched pair
    streams = [(a, 16.0), (b, 16.0), (c, 16.0)]
    spans = [(t[0], t[-1]) for t, _ in streams]
    ms, cached = mlxlm.wide_step(streams, spans, 3)
    assert ms == pytest.approx(2.0, abs=0.1) and cached > 16.0
    assert mlxlm.wide_step(streams, spans, 4) is None  # never 4 at once


def test_the_wide_step_extends_the_decode_line_and_more_rows_never_cost_less():
    # measured 2026-12-07 on mlx_lm.server: B = 6-8 flat at 2.3 ms, less the context share, fell; 25 rows took 10.6 ms
    points = [[1, 0.82], [4, 1.43], [6, 2.34], [7, 2.33], [8, 2.32]]
    got = mlxlm.decode_points(points, 0.000379, 38.0, [25, 10.6, 205.0])
    ys = [ms for _, ms in got]
    assert [b for b, _ in got] == [1, 4, 6, 7, 8, 25] and ys == sorted(ys)
    assert got[-1][1] == pytest.approx(10.6 - 0.000379 * 25 * 205, abs=1e-4)
    assert CostModel(decode_ms=got).decode(16) > CostModel(decode_ms=got).decode(8)
    assert mlxlm.decode_points(points, 0.0, 38.0, None) == points  # nothing to change


def test_a_falling_last_segment_is_not_extended_downward():
    cost = CostModel(decode_ms=[[1, 0.8], [7, 2.33], [8, 2.20]])
    assert cost.decode(25) == pytest.approx(2.20)  # the old extension priced 25 rows at nothing: 2.20 - 17 x 0.13
