"""The held-out rule on planted rows (a tolerance, or 1.5x the live runs' spread) and llama-server's
step books from two /metrics scrapes."""

from __future__ import annotations

import pytest

from harness.calibrate import books, heldout


@pytest.mark.parametrize("predicted, runs, passes", [
    pytest.param(109.0, [100.0] * 3, True, id="inside-tolerance"),
    pytest.param(112.0, [100.0] * 3, False, id="outside-tolerance"),
    pytest.param(112.0, [95.0, 100.0, 105.0], True, id="inside-1.5x-spread"),
    pytest.param(116.0, [95.0, 100.0, 105.0], False, id="outside-1.5x-spread"),
])
def test_the_rule_is_the_tolerance_or_one_and_a_half_spreads(predicted, runs, passes):
    row = heldout.row("aggregate_tok_s", predicted, runs)
    assert row["pass"] is passes and row["measured"] == 100.0, row


SCRAPE = {books.DECODES: 10, books.BUSY: 1.0, books.DRAFTS: 4, books.DRAFT_TOKENS: 12}


def test_server_books_undo_the_running_average_of_busy_slots():
    after = {books.DECODES: 30, books.BUSY: 2.0, books.DRAFTS: 24, books.DRAFT_TOKENS: 70}
    assert books.server_books(SCRAPE, after) == {"steps": 20, "busy_per_step": 2.5, "drafts": 20,
                                                 "draft_tokens": 58, "gen_token_ms": None}


def test_llama_servers_generation_time_a_token_is_its_own_clocks():
    before = {**SCRAPE, books.PREDICTED: 100, books.PREDICTED_SECONDS: 0.5}
    after = {books.DECODES: 30, books.BUSY: 2.0, books.DRAFTS: 24, books.DRAFT_TOKENS: 70,
             books.PREDICTED: 300, books.PREDICTED_SECONDS: 1.1}
    assert books.server_books(before, after)["gen_token_ms"] == pytest.approx(600 / 200)


def test_a_llama_twins_generation_time_a_token_is_its_first_to_last_token():
    from types import SimpleNamespace

    obs = SimpleNamespace(rounds=0, drafted_tokens=0)
    run = SimpleNamespace(ticks=[], scheduler=SimpleNamespace(obs=obs),
                          token_times={"a": [10.0, 12.0, 12.0, 16.0], "b": [20.0, 30.0], "c": []})
    # (6 + 10) ms over 4 + 2 tokens, as llama-server books it: the span from each first token over its tokens
    assert books.twin_books(run)["gen_token_ms"] == pytest.approx(16 / 6)


def test_llamas_drift_is_its_time_a_token_when_the_steps_and_drafts_are_alike():
    twin = {"steps": 100, "busy_per_step": 2.0, "drafts": 50, "draft_tokens": 150, "gen_token_ms": 2.0}
    assert books.price_drift({**twin, "busy_per_step": 2.2, "gen_token_ms": 3.0}, twin) == pytest.approx(0.5)
    assert books.price_drift({**twin, "drafts": 0, "draft_tokens": 0}, {**twin, "drafts": 0}) == pytest.approx(0.0)
    assert books.price_drift({**twin, "busy_per_step": 2.6, "gen_token_ms": 3.0}, twin) is None  # fuller steps
    assert books.price_drift({**twin, "drafts": 70, "gen_token_ms": 3.0}, twin) is None  # other rounds
    assert books.price_drift({**twin, "gen_token_ms": None}, twin) is None  # a server that books no time


def test_a_server_without_the_counters_keeps_no_books():
    assert books.server_books(None, SCRAPE) is None
    assert books.server_books(SCRAPE, {k: v for k, v in SCRAPE.items() if k != books.BUSY}) is None


def test_the_live_books_are_the_runs_mean_and_none_when_a_run_had_none():
    runs = [{"steps": 10, "busy_per_step": 2.0, "drafts": 4, "draft_tokens": 12},
            {"steps": 20, "busy_per_step": None, "drafts": 6, "draft_tokens": 18}]
    assert books.mean_per_key(runs) == {"steps": 15.0, "busy_per_step": None, "drafts": 5.0, "draft_tokens": 15.0}
    assert books.mean_per_key([runs[0], None]) is None


def coopsched_scrape(ticks: dict, busy_s: float) -> dict:
    """A coopsched /metrics scrape: {(kind, rows): (ticks, seconds)} and the worker's busy seconds."""
    out = {books.ENGINE_BUSY: busy_s}
    for (kind, rows), (n, s) in ticks.items():
        labels = f'{{kind="{kind}",rows="{rows}"}}'
        out[books.TICKS + labels], out[books.TICK_SECONDS + labels] = n, s
    return out


def test_coopsched_books_price_each_kind_with_its_share_of_the_workers_overhead():
    before = coopsched_scrape({("round", 1): (10, 0.07), ("decode", 2): (5, 0.01)}, 0.1)
    after = coopsched_scrape({("round", 1): (30, 0.23), ("decode", 2): (15, 0.03), ("decode", 4): (10, 0.03),
                              ("park", 1): (3, 0.0)}, 0.4)
    got = books.server_books(before, after)
    # 40 working ticks (parks are free) of 210 ms in model calls, 300 ms busy: 2.25 ms a tick more
    assert got["ticks"] == 40 and got["rows_per_tick"] == pytest.approx((20 + 20 + 40) / 40)
    assert got["round_ms"] == pytest.approx(160 / 20 + 2.25)
    assert got["decode_ms"] == pytest.approx(50 / 20 + 2.25)
    assert got["admit_ms"] is None and got["busy_ms"] == pytest.approx(300.0)
    assert books.server_books(before, {k: v for k, v in after.items() if k != books.ENGINE_BUSY}) is None


def test_a_twins_coopsched_books_are_its_own_ticks():
    from harness.calibrate import twin
    from harness.run.runner import Profile
    from mocks import CostModel

    kept = {}
    twin.simulate_timed(Profile(CostModel.simple(2.0, 8.0, 0.1)), twin.twin_config("slice"), heldout.workload(5.0, 8),
                        heldout.SEED, on_run=lambda run: kept.setdefault("run", run))
    run = kept["run"]
    got = books.twin_books(run, "coopsched")
    worked = [t for t in run.ticks if t.kind.value not in books.FREE]
    assert got["ticks"] == len(worked) and got["busy_ms"] == pytest.approx(sum(t.end_ms - t.start_ms for t in worked))
    assert (got["decode_ms"], got["round_ms"]) == (pytest.approx(2.0), pytest.approx(8.0))  # as priced
    assert books.mean_per_key([got, got]) == {k: (None if v is None else round(v, 4)) for k, v in got.items()}


def test_the_price_drift_is_the_one_row_ticks_against_their_prices():
    twin = {"admit_ms": 20.0, "slice0_ms": 40.0, "round_ms": 8.0, "decode_ms": 2.0}
    slower = {**{k: v * 1.5 for k, v in twin.items()}, "decode_ms": 9.0}  # a batch's decode is not one row's
    assert books.price_drift(slower, twin) == pytest.approx(0.5)
    assert books.price_drift({**twin, "round_ms": None}, twin) == pytest.approx(0.0)
    assert books.price_drift({"steps": 3}, twin) is None  # llama-server's books price no ticks


def test_vllms_drift_is_its_rows_step_time_when_the_steps_are_alike():
    twin = {"steps": 100, "emitted_per_step": 2.0, "step_ms": 5.0}
    assert books.price_drift({**twin, "emitted_per_step": 2.2, "step_ms": 7.5}, twin) == pytest.approx(0.5)
    assert books.price_drift({**twin, "emitted_per_step": 3.0, "step_ms": 7.5}, twin) is None  # other batches


def vllm_scrape(steps: int, step_tokens: int, emitted: int, drafts: tuple[int, int, int] | None) -> dict:
    """A vLLM /metrics scrape: every sample labelled by engine and model, as vLLM serves them; a row's
    step gaps are the emitted tokens after each request's first (4 requests), 6 ms each."""
    labels = '{engine="0",model_name="tiny"}'
    out = {f"{books.VLLM_STEPS}_count{labels}": steps, f"{books.VLLM_STEPS}_sum{labels}": step_tokens,
           f"{books.VLLM_GENERATED}{labels}": emitted, f"{books.VLLM_STEPS}_bucket{{le=\"1.0\"}}": 1,
           f"{books.VLLM_ITL}_count{labels}": emitted - 4, f"{books.VLLM_ITL}_sum{labels}": (emitted - 4) * 0.006}
    for name, n in zip(books.VLLM_SPEC.values(), drafts or ()):
        out[name + labels] = n
    return out


def test_vllm_books_are_its_steps_tokens_and_drafts_between_two_scrapes():
    got = books.server_books(vllm_scrape(10, 200, 40, (5, 20, 9)), vllm_scrape(30, 560, 140, (45, 180, 70)))
    assert got == {"steps": 20, "tokens_per_step": 18.0, "emitted_per_step": 5.0, "step_ms": pytest.approx(6.0),
                   "drafts": 40, "draft_tokens": 160, "accepted": 61}
    plain = books.server_books(vllm_scrape(10, 200, 40, None), vllm_scrape(30, 560, 140, None))
    assert (plain["drafts"], plain["draft_tokens"], plain["accepted"]) == (0, 0, 0)  # no speculative config
    assert books.server_books({"vllm:num_requests_running": 0}, vllm_scrape(1, 1, 1, None)) is None


@pytest.mark.parametrize("share", [1.0, 0.5])
def test_a_vllm_twins_books_count_its_steps_and_each_rows_drafts(share):
    from harness.calibrate import twin
    from harness.run.runner import Profile
    from mocks import CostModel

    profile = Profile(CostModel.simple(2.0, 8.0, 0.1), "vllm",
                      {"max_num_seqs": 4, "num_speculative_tokens": 3, "propose_share": share})
    kept = {}
    twin.simulate_timed(profile, twin.twin_config("slice"), heldout.workload(5.0, 8), heldout.SEED,
                        on_run=lambda run: kept.setdefault("run", run))
    run = kept["run"]
    got = books.twin_books(run, "vllm")
    worked = [t for t in run.ticks if t.kind.value not in books.FREE]
    verifies = sum(len(t.request_ids) for t in worked if t.kind.value == "round")  # rounds of verify rows only
    emitted = sum(len(r.output_token_ids) for r in run.requests)
    assert got["steps"] == len(worked) and got["emitted_per_step"] == pytest.approx(emitted / len(worked))
    # a row's steps: with a draft every step each is a round (8 ms priced, more beside other rows),
    # with half of them a decode (2 ms) in between
    assert 8.0 <= got["step_ms"] <= 9.0 if share == 1.0 else 2.0 < got["step_ms"] < 8.0
    assert got["draft_tokens"] == 3 * got["drafts"] and got["drafts"] >= verifies > 0
    assert 0 < got["accepted"] <= got["draft_tokens"]
    plain = [t for t in worked if t.kind.value in ("decode", "mixed")]  # rows that decoded one token, no drafts
    assert bool(plain) is (share < 1.0)  # ngram finds no drafts on some row-steps; a draft model on every one
