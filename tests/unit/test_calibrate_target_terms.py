"""`calibrate --target` on what a server reports: the context a request may use comes from whichever
endpoint says it (never an assumed size), and a server that never speculates still gets its prefill
and decode terms, with every speculative term named as unfitted and why; a classic stream is said
to arrive in rounds only when many of its groups carry several tokens."""

import pytest

from harness.calibrate import target
from harness.calibrate.fit import Group
from mocks import CostModel

LLAMA_MODELS = {"id": "tiny.gguf", "meta": {"n_ctx": 1024, "n_ctx_train": 4096}}


@pytest.mark.parametrize(("health", "model", "props", "want"), [
    pytest.param({"context_tokens": 600}, LLAMA_MODELS, None, (600, "/health context_tokens = 600"), id="coopsched"),
    pytest.param({}, LLAMA_MODELS, None, (1024, "/v1/models meta.n_ctx = 1024"), id="llama.cpp-models"),
    pytest.param({}, {"id": "m", "max_model_len": 2048}, None, (2048, "/v1/models max_model_len = 2048"), id="vllm"),
    pytest.param({}, {"id": "m"}, {"default_generation_settings": {"n_ctx": 512}},
                 (512, "/props default_generation_settings.n_ctx = 512"), id="llama.cpp-props"),
])
def test_the_context_is_what_the_server_reports(health, model, props, want):
    assert target.reported_context(health, model, lambda: props) == want


def test_no_reported_context_is_said_and_limits_nothing():
    context, source = target.reported_context({}, {"id": "m"}, lambda: None)
    assert context is None and "reported no context size" in source and "meta.n_ctx" in source
    server = target.Server("http://127.0.0.1:1", context_tokens=context, context_source=source)
    assert target.TargetCalibration(server).lengths == list(target.PREFILL_LENGTHS)


def test_a_small_reported_context_drops_the_prefill_lengths_that_do_not_fit():
    server = target.Server("http://127.0.0.1:1", context_tokens=100)
    assert target.TargetCalibration(server).lengths == [16, 64]


def calibration(rounds: list[int], drafts=None) -> target.TargetCalibration:
    """Samples as a pass would leave them: classic TTFTs and decode gaps, and rounds of `rounds` tokens."""
    calib = target.TargetCalibration(target.Server("http://127.0.0.1:1"))
    s = calib.samples
    s.ttft[False] += [(16, 3.0), (64, 5.0), (256, 13.0), (16, 3.2)]
    s.decode = {1: [2.0, 2.1, 1.9, 2.0], 2: [2.5, 2.6, 2.4, 2.5]}
    s.round_tokens = list(rounds)
    s.round_gaps = [4.0 + 0.1 * (i % 3) for i in range(len(rounds))]
    s.spec_single = int(bool(rounds) and all(n == 1 for n in rounds))
    s.drafts = drafts
    return calib


@pytest.mark.parametrize(("rounds", "drafts", "said"), [
    pytest.param([1] * 40, None, "arrived one token per step", id="one-token-steps"),
    pytest.param([1] * 36 + [2] * 4, [(0, 0)], "counted no draft tokens", id="late-pairs-and-no-drafts"),
    pytest.param([], None, "streamed in one lump", id="lumps"),
    # llama.cpp without a drafter on one core: its stream delivers tokens in bunches, its timings say no drafts
    pytest.param([8, 9, 7, 8] * 10, [(0, 0)] * 3, "how its stream delivers them, not rounds", id="bunched-no-drafts"),
])
def test_without_rounds_prefill_and_decode_are_fitted_and_the_rest_named(rounds, drafts, said):
    calib = calibration(rounds, drafts)
    calib.samples.spec_lumps = 0 if rounds else 3
    profile = calib.profile()
    fitted = profile.pop("fit")
    assert fitted["speculates"] is False
    assert set(fitted["unfitted"]) == set(target.UNFITTED_WITHOUT_ROUNDS)
    assert all(said in why and why.startswith("no speculative rounds were seen") for why in fitted["unfitted"].values())
    assert profile["decode_ms"] == [[1, pytest.approx(2.0, rel=0.05)], [2, pytest.approx(2.5, rel=0.05)]]
    assert profile["prefill_per_token_ms"] == pytest.approx(0.0417, rel=0.05)
    assert profile["round_ms"] is None and profile["accept_prob"] is None
    CostModel(**profile)  # a profile the mock can load


@pytest.mark.parametrize(("rounds", "drafts"), [
    pytest.param([2, 3, 1, 2] * 10, None, id="timed-rounds"),
    pytest.param([1, 1, 1, 2] * 10, [(30, 3)], id="server-counted-drafts"),  # low acceptance, but it drafted
])
def test_rounds_the_timing_or_the_server_shows_are_fitted(rounds, drafts):
    profile = calibration(rounds, drafts).profile()
    assert profile["fit"]["speculates"] is True and profile["fit"]["unfitted"] == {}
    assert profile["round_ms"] == [[4, pytest.approx(4.1, rel=0.05)]] and profile["accept_prob"] > 0
    if drafts:
        assert profile["fit"]["server_drafts"] == {"draft_tokens": 30, "accepted_tokens": 3, "requests": 1,
                                                   "acceptance": 0.1}


def test_no_decode_gaps_is_an_error_naming_the_server():
    calib = calibration([2] * 10)
    calib.samples.decode = {}
    with pytest.raises(RuntimeError, match=r"http://127.0.0.1:1: no classic decode gaps"):
        calib.profile()


def test_the_servers_draft_counts_win_over_timing_that_merges_rounds():
    """Timed groups of 5 tokens with K = 4 are merged rounds; the server's 61% of drafts accepted over
    10 rounds (30 drafts, K - 1 per round) in 40 ms of stream are what gets fitted."""
    calib = calibration([5] * 20, [(30, 18)])
    calib.samples.drafted_spans = [(40.0, 10.0)]
    profile = calib.profile()
    assert profile["accept_prob"] == pytest.approx(target.fit.acceptance_from_tokens(1 + 0.6 * 3, 4), abs=1e-3)
    assert profile["round_ms"] == [[4, 4.0]]
    rounds = profile["fit"]["rounds"]
    assert rounds["from"] == "the server's draft counts" and rounds["timed_accept_prob"] == 1.0


def test_a_bunched_stream_prices_decode_at_its_mean_gap():
    """Tokens delivered in bursts: most gaps ~0 and one in ten 20 ms; a median-based level would read
    ~0 (or, scaled by the pooled ratio, a figure no batch shows); the mean is what decoding costs."""
    bunched = ([0.02] * 9 + [20.0]) * 5
    levels, _ = target.decode_levels({1: bunched, 2: [2 * x for x in bunched]})
    assert levels == {1: pytest.approx(2.018), 2: pytest.approx(4.036)}
    steady = {1: [2.0, 2.1, 1.9, 2.0, 9.0]}  # one foreign stall: the robust level, not the mean
    assert target.decode_levels(steady)[0][1] == pytest.approx(target.fit.levels(steady)[0][1])


def test_one_bunched_batch_beside_steady_ones_prices_every_batch_at_its_mean():
    """B = 1 bunched (median 0.02 ms), B = 2 steady: the pooled median looks steady, but B = 1's
    ratios to its median reach 1000 and would scale B = 2's level to ~100x its gaps."""
    bunched, steady = ([0.02] * 9 + [20.0]) * 5, [2.5, 2.6, 2.4, 2.5] * 20
    levels, _ = target.decode_levels({1: bunched, 2: steady})
    assert levels == {1: pytest.approx(2.018), 2: pytest.approx(2.5)}


def test_each_calibration_sends_prompts_no_earlier_one_sent(monkeypatch):
    """A server's prefix cache, warm from an earlier calibration, must not answer the probes: the
    same key gives the same prompt within one calibration, another calibration's SALT another."""
    from harness.calibrate import target

    first = [target.text_prompt(64, f"prefill:0:64:{s}") for s in (False, True)]
    assert first == [target.text_prompt(64, f"prefill:0:64:{s}") for s in (False, True)]
    monkeypatch.setattr(target, "SALT", target.SALT + "-next")
    again = [target.text_prompt(64, f"prefill:0:64:{s}") for s in (False, True)]
    assert all(a[:8] != b[:8] for a, b in zip(first, again)), (first, again)


def test_a_classic_stream_arrives_in_rounds_only_when_many_of_its_groups_carry_several_tokens():
    def groups(counts):
        return [Group(5.0 * i, 5.0 * i, n) for i, n in enumerate(counts)]

    late_pair = [1] * 20 + [2] + [1] * 25  # one event read late beside the next: a busy client, not rounds
    assert not target.arrived_in_rounds(groups(late_pair))
    assert not target.arrived_in_rounds(groups([1] * 46))
    low_acceptance = ([2, 1, 1] * 16)[:46]  # rounds at ~0.3 acceptance: a third of them carry two tokens
    assert target.arrived_in_rounds(groups(low_acceptance))
    assert target.arrived_in_rounds(groups([3] * 15))
