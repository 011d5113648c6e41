"""What calibration reads from a vLLM server's /metrics for its twin: K from the per-position
acceptance series, and the ngram acceptance that gives the counted tokens per row-step."""

from __future__ import annotations

import pytest

from harness.calibrate import fit
from harness.calibrate.server_params import vllm as sp

LABELS = 'engine="0",model_name="m"'


def scrape(k: int) -> dict[str, float]:
    """A vLLM /metrics as client.scrape_metrics reads it: each position has a _total and a _created."""
    out = {}
    for i in range(k):
        out[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{LABELS},position="{i}"}}'] = 10.0 * (k - i)
        out[f'vllm:spec_decode_num_accepted_tokens_per_pos_created{{{LABELS},position="{i}"}}'] = 1.7e9
    return out


@pytest.mark.parametrize("k", [1, 4, 5])
def test_k_is_the_number_of_positions_counted(k):
    assert sp.spec_positions(scrape(k)) == k


def test_no_speculation_has_no_positions():
    assert sp.spec_positions({f"vllm:generation_tokens_total{{{LABELS}}}": 5.0}) == 0


def counters(generated, requests, drafts, drafted, accepted) -> dict[str, float]:
    return {"vllm:generation_tokens_total": generated, "vllm:request_success_total": requests,
            "vllm:spec_decode_num_drafts_total": drafts, "vllm:spec_decode_num_draft_tokens_total": drafted,
            "vllm:spec_decode_num_accepted_tokens_total": accepted}


def test_acceptance_is_per_proposal_and_the_share_is_of_row_steps():
    # 10 requests, 410 tokens: 10 first tokens, 400 from decode steps of which 150 accepted drafts ->
    # 250 row-steps; 100 of them proposed (400 drafts), each emitting 1 + 150 / 100 = 2.5 tokens
    before, after = counters(0, 0, 0, 0, 0), counters(410, 10, 100, 400, 150)
    got = sp.ngram_acceptance(before, after, 4)
    assert got is not None and got.share == pytest.approx(0.4) and got.length == 4.0
    assert fit.expected_tokens_per_round(got.accept, 5) == pytest.approx(2.5, abs=1e-6)
    # the twin's rows then emit what vLLM's did: 60% decode one, 40% verify 2.5 -> 1.6 a row-step
    assert (1 - got.share) + got.share * fit.expected_tokens_per_round(got.accept, 5) == pytest.approx(1.6, abs=1e-6)
    assert "250 row-steps" in got.evidence and "propose_share 0.4000" in got.evidence


def test_a_proposal_is_as_long_as_vllms_were():
    # measured 2026-12-07 with ngram at K = 4: 925 draft tokens in 281 proposals (3.29 each), 606 accepted;
    # a twin proposing 4 verified 32% more positions than the server, and its knee's steps ran 11% dear
    got = sp.ngram_acceptance(counters(0, 0, 0, 0, 0), counters(2000, 256, 281, 925, 606), 4)
    assert got is not None and got.length == pytest.approx(925 / 281)
    # proposals of 3 and 4 tokens mixed to that mean emit the server's 1 + 606 / 281 tokens each ...
    assert fit.expected_tokens_per_round(got.accept, 1 + got.length) == pytest.approx(1 + 606 / 281, abs=1e-6)
    # ... which lies between what proposals of 3 and of 4 would emit at that acceptance
    assert fit.expected_tokens_per_round(got.accept, 4) < 1 + 606 / 281 < fit.expected_tokens_per_round(got.accept, 5)
    assert "draft_tokens 3.292" in got.evidence


class ProposingServer:
    """A stand-in vLLM with ngram at K = 4: each request of 48 tokens (its first from the prefill) runs
    24 row-steps, 9 of them proposing 3.3 tokens, 2.5 of those accepted."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.totals = counters(0, 0, 0, 0, 0)

    def body(self, prompt: str, max_tokens: int, speculative: bool) -> dict:
        return {"prompt": prompt, "max_tokens": max_tokens, "speculative": speculative}

    def collect(self, body: dict) -> None:
        self.sent.append(body)
        for name, add in zip(self.totals, (48, 1, 9, 9 * 3.3, 23)):
            self.totals[name] += add

    def scrape(self) -> dict[str, float]:
        return dict(self.totals)


def test_the_proposals_are_read_over_lone_requests_like_served_ones():
    server = ProposingServer()
    got = sp.proposals_probe(server, server.scrape, 4)  # type: ignore[arg-type]
    assert len(server.sent) == sp.ACCEPT_PROBES == 64 and all(b["speculative"] for b in server.sent)
    assert {b["max_tokens"] for b in server.sent} == {sp.ACCEPT_TOKENS}
    lengths = [len(b["prompt"]) for b in server.sent]
    assert (min(lengths), max(lengths)) == sp.ACCEPT_CHARS and len(set(lengths)) > 40  # spread, not 16 characters
    # 48 - 1 - 23 = 24 row-steps a request, 9 proposing: share 0.375, 3.3 tokens a proposal, 1 + 23 / 9 emitted
    assert got is not None and got.share == pytest.approx(0.375) and got.length == pytest.approx(3.3)
    assert fit.expected_tokens_per_round(got.accept, 4.3) == pytest.approx(1 + 23 / 9, abs=1e-6)


@pytest.mark.parametrize("p, k", [(0.3, 3.0), (0.6, 3.29), (0.9, 4.5)])
def test_a_fractional_round_is_the_whole_rounds_either_side_mixed(p, k):
    low, high = fit.expected_tokens_per_round(p, int(k)), fit.expected_tokens_per_round(p, int(k) + 1)
    assert fit.expected_tokens_per_round(p, k) == pytest.approx(low + (k - int(k)) * (high - low))
    assert fit.acceptance_from_tokens(fit.expected_tokens_per_round(p, k), k) == pytest.approx(p, abs=1e-6)


def test_acceptance_is_none_without_drafts():
    assert sp.ngram_acceptance(counters(0, 0, 0, 0, 0), counters(100, 2, 0, 0, 0), 4) is None


# -- a prompt-only step's forward, from lone requests' prefill times ---------------------------------------
def prefills(count: float, seconds: float, tokens: float) -> dict[str, float]:
    return {"vllm:request_prefill_time_seconds_count": count, "vllm:request_prefill_time_seconds_sum": seconds,
            sp.PROMPT_TOKENS: tokens}


@pytest.mark.parametrize("count, seconds, tokens, fixed", [
    # 6 lone requests, 4.2 ms each from scheduled to first token, 33-token prompts at 0.02 ms a token
    pytest.param(6, 6 * 0.0042, 6 * 33, 4.2 - 0.66, id="prefill-less-its-tokens"),
    pytest.param(6, 6 * 0.0005, 6 * 33, 0.0, id="never-negative"),
    pytest.param(0, 0.0, 0.0, 0.0, id="not-counted"),
])
def test_a_prompt_only_forward_is_the_lone_prefill_less_its_tokens(count, seconds, tokens, fixed):
    out = sp.VllmFit(lambda line: None)
    sp.prompt_forward(out, prefills(0, 0, 0), prefills(count, seconds, tokens), 0.02)
    assert out.cost["prefill_fixed_ms"] == pytest.approx(fixed, abs=1e-4)
    assert out.cost["shared_prefill_fixed_ms"] == 0.0  # a prompt beside decode rows is in their forward
    assert ("not measured" in out.lines[-1]) is (count == 0)


# -- the frontend's stall of the engine's core, from a stream's gaps around arrivals ---------------------
def stream(n: int, step: float, stalls: dict[int, float]) -> list[float]:
    """Token times of a stream decoding `step` ms a token, the gap before token i `stalls[i]` longer."""
    times, now = [], 0.0
    for i in range(n):
        now += step + stalls.get(i, 0.0)
        times.append(now)
    return times


def test_an_arrival_stall_is_the_excess_of_the_gaps_from_its_send_to_its_first_token():
    # 4 ms steps; an arrival sent at 41 (first token at 52) stretches the gap ending near 49 by 5 ms
    times = stream(40, 4.0, {12: 5.0})
    base, excess = sp.arrival_stalls(times, [(41.0, 53.0)])
    assert base == 4.0 and excess == [5.0]
    assert sp.arrival_stalls(times, [(100.0, 110.0)])[1] == [0.0]  # an arrival over plain steps: none
    assert sp.arrival_stalls(times, [(170.0, 180.0)])[1] == []  # after the stream's last token: not counted


class StallServer:
    """A server decoding a stream 4 ms a step while one-token requests arrive (90 ms apart, first
    token `ttft_ms` after their send): each stretches the step it lands in by `stall_ms` plus its
    prompt's tokens at `per_token_ms` (a short prompt SHORT_TOKENS, a long one LONG_TOKENS)."""
    url, context_tokens = "http://stall", 1024

    def __init__(self, stall_ms: float, per_token_ms: float, ttft_ms: float = 12.0) -> None:
        self.stall_ms, self.per_token_ms, self.ttft_ms = stall_ms, per_token_ms, ttft_ms

    def body(self, prompt, max_tokens, speculative):
        return {"prompt": prompt, "max_tokens": max_tokens}

    def together(self, bodies, offsets):
        from harness.live.client import Arrival, Collected

        tokens = LONG_TOKENS if len(bodies[1]["prompt"]) > sp.STEP_PROMPT else SHORT_TOKENS
        stretch = self.stall_ms + self.per_token_ms * tokens
        times, now = [], 0.0
        while len(times) < sp.STALL_TOKENS:
            now += 4.0 + (stretch if any(now < s <= now + 4.0 for s in offsets[1:]) else 0.0)
            times.append(now)

        def got(sent_ms, times):
            return Collected(int(sent_ms * 1e6), [Arrival(int(t * 1e6), 1, None, "x", None, None, {}) for t in times])
        return [got(0.0, times)] + [got(o, [o + self.ttft_ms]) for o in offsets[1:]]


SHORT_TOKENS, LONG_TOKENS = 16.0, 400.0


def prompt_counts(monkeypatch, long: bool = True) -> None:
    """vLLM's prompt-token counter around the two passes: the short one's stream and arrivals all
    SHORT_TOKENS, the long one's stream SHORT_TOKENS and its arrivals LONG_TOKENS (or, not `long`,
    no long arrival counted)."""
    short = SHORT_TOKENS * (sp.STALL_ARRIVALS + 1)
    long_pass = SHORT_TOKENS + (LONG_TOKENS * sp.STALL_ARRIVALS if long else 0.0)
    counts = iter([0.0, short, short, short + long_pass])
    monkeypatch.setattr(sp.client, "settled", lambda scrape: {sp.PROMPT_TOKENS: next(counts)})


def test_the_stall_probe_splits_an_arrivals_cost_into_the_frontends_and_its_prompts(monkeypatch):
    # every arrival stretches the step it lands in by 5.0 ms of frontend work and 0.01 ms a prompt
    # token: 5.16 ms at 16 tokens, 9.0 at 400 -> 0.01 a token in a decode step's forward, and 5.0
    prompt_counts(monkeypatch)
    out = sp.VllmFit(lambda line: None)
    sp.stall_probe(out, StallServer(5.0, 0.01), {"prefill_per_token_ms": 0.03})
    assert out.cost.get("prefill_per_token_ms") == pytest.approx(0.01)
    assert out.params["frontend_stall_ms"] == pytest.approx(5.0)
    assert "the API server's work shares the engine's core" in out.lines[-1]


def test_without_a_long_pass_the_profiles_per_token_price_takes_the_prompt_out(monkeypatch):
    prompt_counts(monkeypatch, long=False)
    out = sp.VllmFit(lambda line: None)
    sp.stall_probe(out, StallServer(5.5 - 0.48, 0.03), {"prefill_per_token_ms": 0.03})
    assert "prefill_per_token_ms" not in out.cost
    assert out.params["frontend_stall_ms"] == pytest.approx(5.5 - 0.48)  # less 16 tokens at 0.03


def test_no_stall_is_fitted_where_the_arrivals_cost_only_their_prompts(monkeypatch):
    prompt_counts(monkeypatch)
    out = sp.VllmFit(lambda line: None)
    sp.stall_probe(out, StallServer(0.0, 0.02), {"prefill_per_token_ms": 0.03})
    assert out.params["frontend_stall_ms"] == 0.0
    assert out.cost["prefill_per_token_ms"] == pytest.approx(0.02)


# -- planted regressions: the rule removed, the tests above must fail ---------------------------------
def _window_from_first_token(mp):
    """The stall counted only from the arrival's first token (the frontend's share missed)."""
    real = sp.arrival_stalls
    mp.setattr(sp, "arrival_stalls", lambda times, arrivals: real(times, [(f, f + 1.0) for _, f in arrivals]))


def _prompt_not_taken_out(mp):
    """The arrivals' prompts not counted: the twin would charge them twice."""
    mp.setattr(sp, "folded", lambda samples: {})


def _arrivals_after_the_stream_counted(mp):
    """An arrival after the stream's end counted as a stall of 0 (it pulled the median down)."""
    real = sp.arrival_stalls
    mp.setattr(sp, "arrival_stalls", lambda times, arrivals: (real(times, arrivals)[0], [
        real(times, [a])[1][0] if real(times, [a])[1] else 0.0 for a in arrivals]))


PLANTS = {
    "after-the-stream-counted": (_arrivals_after_the_stream_counted, lambda mp: (
        test_an_arrival_stall_is_the_excess_of_the_gaps_from_its_send_to_its_first_token())),
    "window-from-first-token": (_window_from_first_token,
                                test_the_stall_probe_splits_an_arrivals_cost_into_the_frontends_and_its_prompts),
    "prompt-not-taken-out": (_prompt_not_taken_out,
                             test_the_stall_probe_splits_an_arrivals_cost_into_the_frontends_and_its_prompts),
}


@pytest.mark.parametrize("name", list(PLANTS))
def test_planted_regression_is_caught(name, monkeypatch):
    plant, check = PLANTS[name]
    with monkeypatch.context() as mp:
        plant(mp)
        with pytest.raises(AssertionError):
            check(mp)


# -- the context term: steps at a long prompt against the short points ------------------------------------
SHORT = {1: (3.30, 3.10, 39.0), 4: (3.90, 3.60, 39.0)}  # B: (median ms, least ms, cached tokens a row)


def test_the_context_slope_is_the_mean_of_the_long_rows_slopes(monkeypatch):
    # B=1: +0.1 ms over 400 more tokens (0.00025); B=4: +0.8 ms over 4 x 400 (0.0005) -> mean 0.000375
    long = {1: (3.5, 3.2, 439.0), 4: (4.6, 4.4, 439.0)}
    monkeypatch.setattr(sp, "step_costs", lambda server, scrape, batches, chars: {b: long[b] for b in batches})
    slope, why = sp.context_term(None, lambda: None, SHORT)
    assert slope == pytest.approx(0.000375)
    assert "B=4: 4.400 ms at 439 tokens cached a row against 3.600 ms at 39" in why


def test_the_points_are_the_steps_less_their_rows_own_cache():
    assert sp.own_points(SHORT, 0.001) == [[1, pytest.approx(3.30 - 0.039)], [4, pytest.approx(3.90 - 0.156)]]
    assert sp.own_points(SHORT, 0.0) == [[1, 3.3], [4, 3.9]]


@pytest.mark.parametrize("round_points, lone, prompt_price, want", [
    pytest.param([[4, 5.79]], 5.20, 0.018, 0.1475, id="the-round-beyond-a-decode-step"),
    pytest.param([[4, 7.32]], 7.76, 0.018, 0.0, id="never-negative"),
    pytest.param([[3, 9.0]], 5.20, 0.018, 0.018, id="no-round-at-k: a prompt token's price"),
    pytest.param(None, 5.20, None, None, id="nothing-measured"),
])
def test_a_draft_token_is_priced_from_the_lone_round(round_points, lone, prompt_price, want):
    out = sp.VllmFit(lambda line: None)
    if prompt_price is not None:
        out.cost["prefill_per_token_ms"] = prompt_price
    sp.draft_price(out, round_points, lone, 4)
    assert out.cost.get("draft_position_ms") == (pytest.approx(want) if want is not None else None)


def test_a_busy_frontend_is_the_beside_requests_median_beyond_a_lone_ones():
    out = sp.VllmFit(lambda line: None)
    out.params["frontend_ms"] = 4.0
    sp.busy_frontend(out, [8.0, 9.5, 30.0])  # the median: one stalled client does not move it
    assert out.params["frontend_busy_ms"] == 5.5 and "3 requests sent while two others decode" in out.lines[-1]
    quicker = sp.VllmFit(lambda line: None)
    quicker.params["frontend_ms"] = 4.0
    sp.busy_frontend(quicker, [3.0, 3.5])
    assert quicker.params["frontend_busy_ms"] == 0.0  # never less than a lone request's
    unmeasured = sp.VllmFit(lambda line: None)
    sp.busy_frontend(unmeasured, [])
    assert "frontend_busy_ms" not in unmeasured.params and "not measured" in unmeasured.lines[-1]


@pytest.mark.parametrize("length, share, want", [
    pytest.param(None, 1.0, 1.0, id="no-speculation"),
    pytest.param(4.0, 1.0, 5.0, id="a-drafter-proposes-every-step"),
    pytest.param(4.0, 0.389, 2.556, id="ngram-where-its-lookup-matches"),
    pytest.param(3.29, 0.389, 2.27981, id="ngram-proposals-under-k"),
])
def test_a_context_slope_is_spread_over_the_positions_its_probes_verified(length, share, want):
    probed = None if length is None else sp.Proposals(share, length, 0.5, "")
    width = sp.row_step_positions(probed)
    assert width == pytest.approx(want)
    # the twin charges a proposing row-step 1 + its length positions and the others 1: at the probes'
    # share its mean charge a row-step is the measured slope again
    slope, length = 0.000596, length or 0.0
    mean = share * (1 + length) * slope / width + (1 - share) * slope / width
    assert mean == pytest.approx(slope)


def test_a_lone_streams_steps_are_the_twins_spread():
    # one SSE event a step: 98 steps of 1.85 ms, one of 2.45 and one of 4.1 (a stall)
    gaps = [1.85] * 98 + [2.45, 4.1]
    spread = sp.step_spread(gaps)
    assert spread is not None and len(spread) == fit.NUM_QUANTILES
    mean = sum(gaps) / len(gaps)
    assert spread[50] == pytest.approx(1.85 / mean, abs=0.01) and spread[-1] == pytest.approx(4.1 / mean, abs=0.02)
    from mocks.cost import quantile_mean
    assert quantile_mean(spread) == pytest.approx(1.0, abs=1e-3)  # a step keeps its mean price
    assert sp.step_spread([1.9]) is None and sp.step_spread([]) is None
