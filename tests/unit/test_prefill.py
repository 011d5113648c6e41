"""Chunked and batched prefill: spans, tick kinds, exact virtual-time gaps, the mock's price."""

import itertools

import pytest
from factories import make_backend, make_engine, make_requests, token_times

from coopsched.core import ActionKind, Request, SchedulerConfig, TickKind
from coopsched.core.backend import PrefillRow
from coopsched.core.prefill import Budget, spans_for
from coopsched.core.request import SamplingParams
from mocks import CostModel

COST = CostModel()  # prefill 2 ms + 0.2 ms a token (+0.05 with the drafter); decode 5 ms at B = 1, +0.5 a row


def max_gap(times) -> float:
    return max(b - a for a, b in itertools.pairwise(times))


def long_request(seq_id="long", n=300, speculative=False, arrival_ms=20.0, max_tokens=8) -> Request:
    return Request(seq_id, tuple(33 + (i * 7) % 90 for i in range(n)), max_tokens, speculative=speculative,
                   arrival_ms=arrival_ms)


def run(requests, **config):
    engine = make_engine(**config)
    result = engine.run(requests)
    assert engine.scheduler.kv.num_in_use == 0 and engine.executor.backend.num_live == 0
    return engine, result


@pytest.mark.parametrize("kwargs, match", [
    (dict(prefill_chunk_tokens=-1), "prefill_chunk_tokens=-1 must be >= 0"),
    (dict(max_batch_prefill=0), "max_batch_prefill=0 must be >= 1"),
])
def test_bad_knobs_name_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SchedulerConfig(**kwargs)


def test_a_budget_spans_prompts_in_order_and_never_exceeds_itself():
    a, b, c = (long_request(i, n) for i, n in (("a", 10), ("b", 25), ("c", 4)))
    spans = spans_for([a, b, c], Budget(16, 3))
    assert [(s.seq_id, s.start, s.stop) for s in spans] == [("a", 0, 10), ("b", 0, 6)]
    b.num_prefilled = 6
    assert [(s.seq_id, s.start, s.stop) for s in spans_for([b, c], Budget(16, 1))] == [("b", 6, 22)]
    assert [(s.start, s.stop) for s in spans_for([a, b, c], Budget(0, 2))] == [(0, 10), (6, 25)]  # 0: whole


def test_a_long_classic_prompt_is_prefilled_in_chunks_with_a_decode_step_between():
    classic = make_requests(2, max_tokens=60, prefix="c", speculative=False)
    _, result = run([*classic, long_request()], prefill_chunk_tokens=64)
    chunks = [t for t in result.ticks if t.kind is TickKind.CHUNK]
    assert [t.prefill_tokens for t in chunks] == [(64,), (64,), (64,), (64,), (44,)]
    assert all(t.wall_ms == pytest.approx(COST.chunk(n)) for t, (n,) in zip(chunks, [t.prefill_tokens for t in chunks]))
    after = [result.ticks[result.ticks.index(t) + 1].kind for t in chunks]
    assert after == [TickKind.DECODE] * 5  # the decode rows step after every chunk
    gaps = token_times(result)["c0"]
    assert max_gap(gaps) == pytest.approx(COST.chunk(64) + COST.decode(2))
    assert chunks[0].to_json()["detail"] == "chunk" and chunks[0].to_json()["prefill_tokens"] == [64]


def test_without_chunking_the_whole_prefill_sits_in_one_gap():
    classic = make_requests(2, max_tokens=60, prefix="c", speculative=False)
    _, result = run([*classic, long_request()])
    gaps = token_times(result)["c0"]
    assert max_gap(gaps) == pytest.approx(COST.prefill(300) + COST.decode(3))


@pytest.mark.parametrize("mode", ["slice", "fused", "cost"])
def test_a_speculative_slice0_is_chunked_and_its_first_round_waits_for_the_whole_prompt(mode):
    classic = make_requests(1, max_tokens=80, prefix="c", speculative=False)
    spec = long_request("s", speculative=True, max_tokens=12)
    engine, result = run([*classic, spec], prefill_chunk_tokens=64, mode=mode)
    ticks = [t for t in result.ticks if "s" in t.request_ids]
    chunks = [t for t in ticks if t.kind is TickKind.CHUNK]
    assert [t.prefill_tokens for t in chunks] == [(64,), (64,), (64,), (64,), (44,)]
    assert chunks[0].action is ActionKind.PREFILL  # the admission tick prefills the first chunk
    assert all(t.action is ActionKind.SPEC_ROUND for t in chunks[1:])
    first_round = next(i for i, t in enumerate(ticks) if t.kind in (TickKind.ROUND, TickKind.FUSED))
    assert ticks.index(chunks[-1]) < first_round
    assert token_times(result)["s"][0] == chunks[-1].end_ms  # the first token ends slice 0
    (burst,) = engine.scheduler.obs.bursts
    assert burst.burst_wall_ms <= max(COST.round(4), COST.chunk(64, True)) < COST.slice0(300)  # not the prompt
    gaps = token_times(result)["c0"]
    if mode == "slice":  # one chunk or one round per classic gap
        assert max_gap(gaps) == max(COST.chunk(64, True), COST.round(4)) + COST.decode(1)


def test_a_batched_prefill_admits_several_requests_in_one_forward_paying_the_fixed_cost_once():
    requests = make_requests(4, prompt_len=10, max_tokens=6, speculative=False)
    _, result = run(requests, max_batch_prefill=4)
    (admit,) = [t for t in result.ticks if t.action is ActionKind.PREFILL]
    assert admit.kind is TickKind.ADMIT and admit.request_ids == ("r0", "r1", "r2", "r3")
    assert admit.wall_ms == pytest.approx(COST.prefill_batch([(10, False)] * 4)) == 2.0 + 0.2 * 40
    assert {tuple(ts[:1]) for ts in token_times(result).values()} == {(admit.end_ms,)}  # every TTFT at once


def test_a_batched_prefill_stops_at_a_speculative_request_and_keeps_queue_order():
    """Fused (and cost) mode's own rule: a speculative request waits to head its own admission."""
    requests = make_requests(5, prompt_len=6, max_tokens=4, speculative=False)
    requests[2].speculative = True
    _, result = run(requests, max_batch_prefill=8, mode="fused")
    admissions = [t.request_ids for t in result.ticks if t.action is ActionKind.PREFILL]
    assert admissions[:3] == [("r0", "r1"), ("r2",), ("r3", "r4")]


@pytest.mark.parametrize("mode", ["slice", "burst"])
def test_upstream_batched_prefill_bypasses_speculation_with_two_or_more_queued(mode):
    requests = make_requests(5, prompt_len=6, max_tokens=4, speculative=False)
    requests[2].speculative = True
    engine, result = run(requests, max_batch_prefill=8, mode=mode)
    admissions = [t.request_ids for t in result.ticks if t.action is ActionKind.PREFILL]
    assert admissions[0] == ("r0", "r1", "r2", "r3", "r4")
    assert not requests[2].served_speculatively and not engine.scheduler.obs.bursts
    lone = Request("s", (1, 2, 3), 8)  # one queued request takes the single path: speculation as usual
    engine, _ = run([lone], max_batch_prefill=8, mode=mode)
    assert lone.served_speculatively


def test_chunks_and_admissions_share_one_budget_and_the_row_cap():
    """Fused (and cost) mode's own rule: a chunked prompt's last chunk and new admissions share a tick."""
    requests = [long_request("a", 50, arrival_ms=0), *make_requests(3, prompt_len=20, max_tokens=4, prefix="b",
                                                                     speculative=False)]
    _, result = run(requests, prefill_chunk_tokens=32, max_batch_prefill=2, mode="fused")
    prefills = [(t.request_ids, t.prefill_tokens or None) for t in result.ticks if t.action is ActionKind.PREFILL]
    assert prefills[:3] == [(("a",), (32,)), (("a", "b0"), (18, 14)), (("b0", "b1"), (6, 20))]


def test_upstream_admits_nothing_while_a_prompt_is_chunked():
    requests = [long_request("a", 50, arrival_ms=0), *make_requests(3, prompt_len=20, max_tokens=4, prefix="b",
                                                                     speculative=False)]
    _, result = run(requests, prefill_chunk_tokens=32, mode="slice")
    prefills = [(t.request_ids, t.prefill_tokens or None) for t in result.ticks if t.action is ActionKind.PREFILL]
    assert prefills[:3] == [(("a",), (32,)), (("a",), (18,)), (("b0",), None)]


def test_a_cancelled_prefilling_row_stops_before_its_next_chunk():
    engine = make_engine(prefill_chunk_tokens=64)
    scheduler = engine.scheduler
    request = long_request(arrival_ms=0)
    scheduler.submit(request)
    engine.step()
    assert request in scheduler.prefilling and request.num_prefilled == 64
    scheduler.cancel(request.id)
    committed = engine.step()
    assert [e.finish_reason.value for e in committed.events] == ["stop"] and request.output_token_ids == []
    assert not scheduler.prefilling and scheduler.kv.num_in_use == 0 and engine.executor.backend.num_live == 0


def test_mock_prefill_batch_equals_whole_prefills_and_checks_its_spans():
    prompt = tuple(range(40, 100))
    whole = make_backend().prefill("x", prompt, SamplingParams(), False)
    backend = make_backend()
    row = lambda start, stop: PrefillRow("x", prompt, start, stop, SamplingParams(), False)
    assert backend.prefill_batch([row(0, 25)]) == [None]
    assert backend.prefill_batch([row(25, 60)]) == [whole]
    with pytest.raises(ValueError, match=r"span \[10, 20\) of a 60-token prompt, but its cache holds 60"):
        backend.prefill_batch([row(10, 20)])
    assert backend.clock.now() == pytest.approx(COST.chunk(25) + COST.chunk(35))


def test_a_mixed_step_is_one_tick_of_a_chunk_and_the_decode_rows_priced_from_the_terms():
    classic = make_requests(2, max_tokens=60, prefix="c", speculative=False)
    engine, result = run([*classic, long_request()], prefill_chunk_tokens=64, mixed_step=True)
    mixed = [t for t in result.ticks if t.kind is TickKind.MIXED]
    assert [t.prefill_tokens for t in mixed] == [(0, 0, 64), (0, 0, 64), (0, 0, 64), (0, 0, 44)]
    assert all(t.action is ActionKind.MIXED and t.request_ids == ("c0", "c1", "long") for t in mixed)
    assert all(t.wall_ms == pytest.approx(COST.mixed(t.prefill_tokens[-1], 2)) for t in mixed)
    assert COST.mixed(64, 2) == pytest.approx(COST.chunk(64) + COST.decode(2))
    assert engine.scheduler.obs.mixed_steps == 4 and engine.scheduler.obs.prefill_grants == 0
    assert max_gap(token_times(result)["c0"]) == pytest.approx(COST.chunk(64) + COST.mixed(64, 2))  # admission + M
