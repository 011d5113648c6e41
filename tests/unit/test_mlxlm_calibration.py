"""The pure parts of mlx_lm.server's calibration: the prefill line (each length's fastest, the stalls
pooled, the longest length left out past linear), first tokens grouped into steps, a round priced
from a stream's mean gap; and the twin priced by the fitted line, in virtual time."""

from __future__ import annotations

import numpy as np
import pytest

from coopsched.core import SchedulerConfig
from harness.calibrate import fit, heldout, twin
from harness.calibrate.server_params import mlxlm
from harness.calibrate.server_params.mlxlm import cluster_sizes, prefill_line, round_per_token, waves_of
from harness.run.runner import Profile
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


def test_a_round_is_priced_from_the_streams_mean_gap():
    terms = round_per_token({"long_itl_ms": 3.0}, {"accept_prob": 0.5}, lambda _: None)
    assert terms["round_ms"] == [[4, pytest.approx(3.0 * 1.875)]]  # 1 + 0.5 + 0.25 + 0.125 tokens a round
    assert round_per_token({"long_itl_ms": 3.0}, {"accept_prob": None}, lambda _: None) == {}


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
