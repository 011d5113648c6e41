"""The fidelity terms of the cost model: each default reproduces the earlier costs exactly;
padding, the path switch, fitted jitter and a whole-round term change costs as documented."""

import json
import random

import pytest
from factories import make_backend

from coopsched.clock import ManualClock
from coopsched.core import SamplingParams
from harness.run import runner, scenario
from harness.run.scenario import SCENARIO_DIR
from mocks import CostModel
from mocks.cost import quantile_mean

K = 4
TODAY = CostModel()  # decode 5 ms at B = 1, +0.5 ms a row; draft 2 ms a token; verify(4) 14 ms
PARAMS = SamplingParams()


def charged(cost: CostModel, calls) -> list[float]:
    """What each call costs on a fresh mock backend in virtual time."""
    clock = ManualClock()
    backend = make_backend(clock, cost=cost)
    for i in range(3):
        backend.prefill(f"s{i}", (65, 66, 67), PARAMS, True)
    out = []
    for call in calls:
        before = clock.now()
        call(backend)
        out.append(clock.now() - before)
    return out


DECODE = lambda b: b.decode([("s0", 65)])
DRAFT = lambda b: b.draft([("s1", 65)], K - 1)
VERIFY = lambda b: b.verify([("s1", 65, [66, 67, 68])])
FUSED = lambda b: b.fused([("s0", 65), ("s2", 65)], [("s1", 65, [66, 67, 68])])


# -- defaults: the earlier costs --------------------------------------------------------------
def test_default_terms_are_the_earlier_formulas():
    c = TODAY
    assert (c.round_ms, c.fused_padding, c.switch_ms, c.jitter_quantiles, c.accept_prob) == \
        (None, "ragged", 0.0, None, None)
    for rows in (1, 2, 4):
        assert c.round(K, rows) == c.draft(K - 1) + c.verify(rows * K)
    for width in (1, 4, 12):
        assert c.verify_charge(width, K - 1) == c.verify(width)
    assert c.fused_forward(3, [K, K]) == c.decode(3 + 2 * K)
    assert c.fused_forward(2, []) == c.decode(2)
    assert c.fused_step(1, K) == c.draft(K - 1) + c.decode(1 + K)
    assert c.max_jitter_factor == 1.0
    assert c.shared_prefill_fixed_ms is None  # a prompt beside decode rows pays a forward's fixed cost, as before
    assert c.prefill(10, True, shared=True) == c.prefill(10, True) == 2.0 + 0.2 * 10 + 0.05 * 10
    assert c.draft_position_ms is None and c.verify_charge(12, K - 1, 3) == c.verify(12)  # a draft is a row
    assert c.prefill_batch([(10, False), (6, True)], shared=True) == c.prefill_batch([(10, False), (6, True)])
    assert c.mixed(64, 2) == c.chunk(64) + c.decode(2)


def test_default_mock_charges_are_the_earlier_ones():
    assert charged(TODAY, [DECODE, DRAFT, VERIFY, DECODE, FUSED, DECODE]) == \
        [5.0, 6.0, TODAY.verify(4), 5.0, TODAY.decode(2 + K), 5.0]


def test_no_jitter_draws_nothing_and_uniform_jitter_draws_as_before():
    rng, twin = random.Random(3), random.Random(3)
    assert TODAY.jittered(rng, 7.0, "decode") == 7.0 and rng.random() == twin.random()
    jittery = CostModel(jitter=0.2)
    rng, twin = random.Random(5), random.Random(5)
    assert jittery.jittered(rng, 10.0, "decode") == 10.0 * (1.0 + twin.uniform(-0.2, 0.2))


def test_an_old_profile_loads_with_the_earlier_terms():
    profile = CostModel.load(SCENARIO_DIR / "profiles" / "mlx-cpu-s.json")
    assert profile.round_ms is None and profile.fused_padding == "ragged" and profile.switch_ms == 0.0
    assert profile.round(K) == profile.draft(K - 1) + profile.verify(K)
    assert profile.shared_prefill_fixed_ms is None and profile.prefill(8, shared=True) == profile.prefill(8)


# -- a prompt inside a decode step's forward ------------------------------------------------------
SHARED = CostModel(prefill_fixed_ms=3.0, prefill_per_token_ms=0.5, shared_prefill_fixed_ms=0.0)


@pytest.mark.parametrize("price, want", [
    pytest.param(lambda c: c.prefill(4), 3.0 + 2.0, id="prompt-only-pays-a-forward"),
    pytest.param(lambda c: c.prefill(4, shared=True), 2.0, id="beside-decodes-its-tokens-only"),
    pytest.param(lambda c: c.prefill_batch([(4, False), (2, False)]), 3.0 + 3.0, id="batch-one-forward"),
    pytest.param(lambda c: c.prefill_batch([(4, False), (2, False)], shared=True), 3.0, id="batch-beside-decodes"),
    pytest.param(lambda c: c.mixed(4, 2), 2.0 + SHARED.decode(2), id="mixed-one-forward"),
    pytest.param(lambda c: c.mixed(4, 0), 3.0 + 2.0, id="a-chunk-alone-pays-a-forward"),
])
def test_a_shared_prefill_pays_the_shared_fixed_cost(price, want):
    assert price(SHARED) == pytest.approx(want)


# -- a draft position inside one forward (vLLM's step) ------------------------------------------------
RIDING = CostModel(decode_ms=[[1, 4.0], [8, 11.0]], verify_ms=[[1, 4.0], [64, 100.0]], draft_position_ms=0.25)


@pytest.mark.parametrize("price, want, as_rows", [
    pytest.param(lambda c: c.fused_forward(3, [K, 3]), RIDING.decode(5) + 0.25 * (K - 1 + 2),
                 RIDING.decode(5 + K - 1 + 2), id="fused"),
    pytest.param(lambda c: c.verify_charge(2 * K, K - 1, 2), RIDING.decode(2) + 0.25 * 2 * (K - 1),
                 RIDING.verify(2 * K), id="round"),
    pytest.param(lambda c: c.fused_forward(2, []), RIDING.decode(2), RIDING.decode(2), id="decodes-only"),
    pytest.param(lambda c: c.round(K, 2), RIDING.draft(K - 1) + RIDING.decode(2) + 0.25 * 2 * (K - 1),
                 RIDING.draft(K - 1) + RIDING.verify(2 * K), id="bounds-round-as-charged"),
])
def test_a_draft_position_costs_its_price_beside_the_rows_decode(price, want, as_rows):
    """A step of decode rows and verify rows is one forward: its rows' decode, plus each draft token at
    `draft_position_ms`, whether the step holds decode rows (fused) or only verify rows (a round);
    without the term a draft position is priced as a row (fused) or by the verify points (a round)."""
    assert price(RIDING) == pytest.approx(want)
    assert price(CostModel(**{**RIDING.to_json(), "draft_position_ms": None})) == pytest.approx(as_rows)


def test_the_mock_charges_a_shared_prefill_without_its_forward():
    clock = ManualClock()
    backend = make_backend(clock, cost=SHARED)
    backend.prefill("a", (65, 66, 67, 68), PARAMS, False)
    backend.prefill("b", (65, 66, 67, 68), PARAMS, False, shared=True)
    assert clock.now() == pytest.approx(5.0 + 2.0)


def test_a_profile_round_trips_through_json(tmp_path):
    cost = CostModel(round_ms=[[4, 40.0], [8, 60.0]], fused_padding="split", switch_ms=1.5,
                     jitter_quantiles={"decode": [0.5, 1.0, 1.5]}, accept_prob=0.6)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(cost.to_json()))
    assert CostModel.load(path) == cost


# -- padding ---------------------------------------------------------------------------------
@pytest.mark.parametrize("padding, want", [
    pytest.param("ragged", TODAY.decode(2 + K), id="ragged-real-positions"),
    pytest.param("padded", TODAY.decode((2 + 1) * K), id="padded-every-row-to-k"),
    pytest.param("split", TODAY.decode(2) + TODAY.verify(K), id="split-two-forwards"),
])
def test_fused_padding_prices_what_the_backend_computes(padding, want):
    cost = CostModel(fused_padding=padding)
    assert cost.fused_forward(2, [K]) == pytest.approx(want)
    assert cost.fused_step(2, K) == pytest.approx(cost.draft(K - 1) + want)
    assert charged(cost, [FUSED]) == [pytest.approx(want)]


def test_padding_costs_more_the_more_classic_rows_there_are():
    ragged, padded = CostModel(), CostModel(fused_padding="padded")
    extra = [padded.fused_forward(c, [K]) - ragged.fused_forward(c, [K]) for c in (1, 4, 8)]
    assert 0 < extra[0] < extra[1] < extra[2]


def test_split_without_classic_rows_is_the_verify():
    cost = CostModel(fused_padding="split")
    assert cost.fused_forward(0, [K]) == cost.verify(K)


# -- the classic/speculative switch ------------------------------------------------------------
def test_switch_is_charged_on_each_change_of_path():
    cost = CostModel(switch_ms=1.5)
    got = charged(cost, [DECODE, DECODE, DRAFT, VERIFY, DECODE, FUSED, DRAFT, FUSED, DECODE])
    base = charged(TODAY, [DECODE, DECODE, DRAFT, VERIFY, DECODE, FUSED, DRAFT, FUSED, DECODE])
    # decode -> draft, verify -> decode, decode -> fused, fused -> decode; a fused forward is the spec path
    assert [g - b for g, b in zip(got, base)] == [0, 0, 1.5, 0, 1.5, 1.5, 0, 0, 1.5]


def test_prefill_neither_pays_nor_resets_the_switch():
    cost = CostModel(switch_ms=2.0)
    clock = ManualClock()
    backend = make_backend(clock, cost=cost)
    backend.prefill("a", (65,), PARAMS, True)
    backend.decode([("a", 66)])  # the first model call after a prefill: no switch
    backend.prefill("b", (65,), PARAMS, True)
    before = clock.now()
    backend.draft([("b", 66)], K - 1)  # classic -> spec across the prefill: one switch
    assert clock.now() - before == cost.draft(K - 1) + 2.0


def test_a_switch_widens_the_slice_bound_by_two_switches():
    from harness.run.bounds import terms_of

    scen = scenario.load("concurrency2")
    plain = terms_of(runner.execute(scen, runner.scenario_config(scen, "slice")))
    profile = CostModel(**{**scen.cost, "switch_ms": 3.0})
    run = runner.execute(scen, runner.scenario_config(scen, "slice"),
                         backend_factory=lambda c, s, seed: runner.mock_backend(c, s, seed, profile))
    assert terms_of(run).round_ms == plain.round_ms + 6.0


# -- a whole round as one term ---------------------------------------------------------------------
def test_round_term_prices_the_round_and_the_verify_takes_the_rest():
    cost = CostModel(round_ms=[[2, 20.0], [4, 42.0]], draft_per_token_ms=0.0, verify_ms=[[1, 5.0], [16, 35.0]])
    assert cost.round(K) == 42.0 and cost.round(2) == 20.0 and cost.round(3) == 31.0
    assert cost.round(K, 2) == 42.0 + cost.verify(8) - cost.verify(4)  # a window's other row: its verify width
    assert cost.verify_charge(K, K - 1) == 42.0 and cost.verify_charge(2, 1) == 20.0
    drafting = CostModel(round_ms=[[4, 42.0]], draft_per_token_ms=4.0)
    assert drafting.round(K) == drafting.round(2) == 42.0  # one point: every K alike
    assert drafting.verify_charge(K, K - 1) == 30.0
    assert sum(charged(drafting, [DRAFT, VERIFY])) == 42.0


def test_round_term_reaches_the_split_fused_forward():
    cost = CostModel(round_ms=[[4, 42.0]], draft_per_token_ms=2.0, fused_padding="split")
    assert cost.fused_forward(1, [K]) == cost.decode(1) + 42.0 - 6.0


# -- fitted jitter ------------------------------------------------------------------------------------
def test_fitted_quantiles_scale_only_their_term():
    cost = CostModel(jitter_quantiles={"decode": [0.8, 1.0, 1.4]})
    rng = random.Random(0)
    draws = [cost.jittered(rng, 10.0, "decode") for _ in range(20_000)]
    assert 8.0 <= min(draws) and max(draws) <= 14.0
    assert sum(draws) / len(draws) == pytest.approx(10.0 * quantile_mean([0.8, 1.0, 1.4]), rel=0.01)
    assert cost.jittered(rng, 10.0, "verify") == 10.0  # no quantiles for verify, no uniform jitter
    assert cost.max_jitter_factor == 1.4


def test_quantiles_are_drawn_by_their_inverse_cdf():
    cost = CostModel(jitter_quantiles={"verify": [1.0, 2.0, 5.0]})
    u = random.Random(9).random()
    want = 1.0 + 2.0 * u if u < 0.5 else 2.0 + 6.0 * (u - 0.5)
    assert cost.jittered(random.Random(9), 1.0, "verify") == pytest.approx(want)


def test_fitted_jitter_carries_into_mock_runs_and_is_seeded():
    cost = CostModel(jitter_quantiles={"decode": [0.5, 1.0, 1.5]})
    first, again = charged(cost, [DECODE] * 50), charged(cost, [DECODE] * 50)
    assert first == again and len(set(first)) > 40 and min(first) >= 2.5 and max(first) <= 7.5


# -- the profile's acceptance -----------------------------------------------------------------------------
def test_profile_acceptance_is_the_fallback_of_the_mock_drafter():
    scen = scenario.load("concurrency2")  # sets no accept_prob of its own
    assert runner.mock_backend(ManualClock(), scen, 0).drafter.accept_prob == runner.DEFAULT_ACCEPT_PROB
    profile = CostModel(accept_prob=0.35)
    assert runner.mock_backend(ManualClock(), scen, 0, profile).drafter.accept_prob == 0.35
    own = scenario.Scenario("x", mock={"accept_prob": 0.9}, requests=scen.requests)
    assert runner.mock_backend(ManualClock(), own, 0, profile).drafter.accept_prob == 0.9


@pytest.mark.parametrize("field, value, says", [
    pytest.param("fused_padding", "dense", "ragged, padded, split", id="padding"),
    pytest.param("switch_ms", -1.0, ">= 0", id="negative-switch"),
    pytest.param("shared_prefill_fixed_ms", -0.5, ">= 0 (or null)", id="negative-shared-fixed"),
    pytest.param("draft_position_ms", -0.1, ">= 0 (or null)", id="negative-draft-position"),
    pytest.param("accept_prob", 1.5, "[0, 1]", id="acceptance"),
    pytest.param("round_ms", [[4]], "[K, ms >= 0]", id="round-points"),
    pytest.param("jitter_quantiles", {"decode": [1.2, 0.9]}, "non-decreasing", id="quantiles-order"),
    pytest.param("jitter_quantiles", {"tick": [1.0, 1.0]}, "unknown term 'tick'", id="quantiles-term"),
])
def test_bad_fidelity_terms_are_refused_by_name(field, value, says):
    with pytest.raises(ValueError, match=field) as info:
        CostModel(**{field: value})
    assert says in str(info.value)
