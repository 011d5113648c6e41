"""The acceptance walk and a speculative request's life, incl. upstream's scripted case."""

import pytest
from factories import make_backend, make_engine

from coopsched.core import FinishReason, Request, SamplingParams, accept_walk
from coopsched.core.policy import ActionKind
from mocks import MockTarget

EOS = 9999
PROMPT = (1, 2, 3)
UPSTREAM_STREAM = [100, 10, 11, 12, 13, 20, 21, 22]


@pytest.mark.parametrize("drafts, targets, budget, emitted, accepted", [
    pytest.param([1, 2, 3], [1, 2, 3, 4], 10, [1, 2, 3, 4], 3, id="full-accept"),
    pytest.param([1, 2, 3], [9, 2, 3, 4], 10, [9], 0, id="early-mismatch"),
    pytest.param([1, 2, 3], [1, 2, 8, 4], 10, [1, 2, 8], 2, id="late-mismatch"),
    pytest.param([1, 2, 3], [1, 2, 3, 4], 3, [1, 2, 3], 3, id="budget-cuts-bonus"),
    pytest.param([1, 2, 3], [1, 2, 3, 4], 1, [1], 3, id="budget-one"),
    pytest.param([1, 2, 3], [1, 7, 3, 4], 2, [1, 7], 1, id="budget-equals-emitted"),
    pytest.param([], [5], 4, [5], 0, id="no-drafts"),
])
def test_accept_walk(drafts, targets, budget, emitted, accepted):
    assert accept_walk(drafts, targets, budget) == (emitted, accepted)


def test_accept_walk_rejects_wrong_verify_width():
    with pytest.raises(ValueError, match="3 targets for 3 drafts"):
        accept_walk([1, 2, 3], [1, 2, 3], 5)


def upstream(mode: str, cancel_after_slices: int | None = None):
    """Upstream's scripted case: first token 100, two rounds of K = 4, EOS 9999 in round 2."""
    target = MockTarget(eos_token_id=EOS, scripts={PROMPT: [*UPSTREAM_STREAM, EOS]})
    backend = make_backend(target=target, scripts={"s": [3, 3]})
    engine = make_engine(backend, mode=mode, block_size=4)
    scheduler, request = engine.scheduler, Request("s", PROMPT, max_tokens=64)
    if cancel_after_slices is None:
        return engine, request, engine.run([request])
    events = []
    scheduler.submit(request)
    for _ in range(cancel_after_slices):
        events += engine.step().events
    scheduler.cancel("s")
    while scheduler.has_work:
        events += engine.step().events
    return engine, request, events


@pytest.mark.parametrize("mode", ["slice", "burst"])
def test_upstream_scripted_case(mode):
    engine, request, result = upstream(mode)
    assert request.output_token_ids == UPSTREAM_STREAM
    assert request.finish_reason is FinishReason.STOP
    (record,) = engine.scheduler.obs.bursts
    assert (record.rounds, record.accepted_draft_tokens, record.drafted_tokens) == (2, 6, 6)
    lumps = [list(e.token_ids) for e in result.events if e.token_ids]
    if mode == "slice":
        assert record.slices == 3
        assert lumps == [[100], [10, 11, 12, 13], [20, 21, 22]]
        assert [t.action for t in result.ticks] == ["prefill", "spec_round", "spec_round"]
    else:
        assert record.slices == 1
        assert lumps == [UPSTREAM_STREAM]
        assert [t.action for t in result.ticks] == ["prefill"]


def test_upstream_case_equals_classic_decode():
    target = MockTarget(eos_token_id=EOS, scripts={PROMPT: [*UPSTREAM_STREAM, EOS]})
    scheduler = make_engine(make_backend(target=target))
    request = Request("c", PROMPT, max_tokens=64, speculative=False)
    scheduler.run([request])
    assert request.output_token_ids == UPSTREAM_STREAM and not request.served_speculatively


def test_cancel_after_slice_1_stops_before_another_round():
    engine, request, _events = upstream("slice", cancel_after_slices=2)
    assert request.output_token_ids == [100, 10, 11, 12, 13]
    assert request.finish_reason is FinishReason.STOP
    (record,) = engine.scheduler.obs.bursts
    assert record.rounds == 1 and record.slices == 2
    assert engine.scheduler.kv.num_in_use == 0 and engine.executor.backend.num_live == 0


@pytest.mark.parametrize("first, max_tokens, expected, reason", [
    pytest.param(EOS, 8, [], FinishReason.STOP, id="eos-first"),
    pytest.param(100, 1, [100], FinishReason.LENGTH, id="max-tokens-1"),
])
def test_slice0_can_finish_at_once(first, max_tokens, expected, reason):
    target = MockTarget(eos_token_id=EOS, scripts={PROMPT: [first, 5, 6]})
    scheduler = make_engine(make_backend(target=target))
    request = Request("s", PROMPT, max_tokens=max_tokens)
    result = scheduler.run([request])
    assert request.output_token_ids == expected and request.finish_reason is reason
    assert [t.kind.detail for t in result.ticks if t.action != ActionKind.IDLE.value] == ["slice0"]
    assert scheduler.scheduler.obs.bursts[0].rounds == 0


def test_stop_string_wins_and_ends_the_round():
    target = MockTarget(scripts={PROMPT: [ord(c) for c in "abcdefgh"]})
    scheduler = make_engine(make_backend(target=target, accept_prob=1.0))
    request = Request("s", PROMPT, max_tokens=64, stop=("cd",))
    scheduler.run([request])
    assert bytes(request.output_token_ids) == b"abcd"
    assert request.finish_reason is FinishReason.STOP


@pytest.mark.parametrize("speculative", [True, False])
def test_a_stop_string_waits_for_min_tokens_and_an_earlier_match_does_not_count_later(speculative):
    """vLLM's rule: "cd" at tokens 3-4 falls before min_tokens = 6 and never ends the request, not even
    when min_tokens is reached; the next "cd" (tokens 9-10) does."""
    target = MockTarget(scripts={PROMPT: [ord(c) for c in "abcdefghcdxyz"]})
    scheduler = make_engine(make_backend(target=target, accept_prob=1.0))
    request = Request("s", PROMPT, 64, SamplingParams(min_tokens=6), stop=("cd",),
                      speculative=speculative)
    scheduler.run([request])
    assert bytes(request.output_token_ids) == b"abcdefghcd"
    assert request.finish_reason is FinishReason.STOP


def test_eos_never_committed_mid_round():
    target = MockTarget(eos_token_id=EOS, scripts={PROMPT: [7, 8, EOS, 9]})
    scheduler = make_engine(make_backend(target=target, accept_prob=1.0))
    request = Request("s", PROMPT, max_tokens=64)
    scheduler.run([request])
    assert request.output_token_ids == [7, 8] and request.finish_reason is FinishReason.STOP


@pytest.mark.parametrize("mode", ["slice", "burst"])
def test_a_failed_rewind_ends_only_its_row_with_the_error(mode):
    """The target cache of a row whose rewind failed is wrong: the row ends with the error before
    its next round; the classic row and its slot are untouched."""
    backend = make_backend(accept_prob=0.0)  # every round rejects drafts: every round rewinds
    rewind = backend.rewind

    def failing(seq_id, num_tokens):
        if seq_id == "s":
            raise RuntimeError("cache trim failed")
        rewind(seq_id, num_tokens)
    backend.rewind = failing
    engine = make_engine(backend, mode=mode)
    spec, classic = Request("s", PROMPT, max_tokens=20), Request("c", PROMPT, max_tokens=6, speculative=False)
    result = engine.run([spec, classic])
    healthy = Request("s", PROMPT, max_tokens=20)
    make_engine(make_backend(accept_prob=0.0), mode=mode).run([healthy])
    assert spec.output_token_ids == healthy.output_token_ids[: len(spec.output_token_ids)]  # no round on a bad cache
    assert spec.finish_reason is FinishReason.ERROR and "cache trim failed" in spec.error
    assert 0 < len(spec.output_token_ids) < 20 and classic.finish_reason is FinishReason.LENGTH
    streamed = [t for e in result.events if e.seq_id == "s" for t in e.token_ids]
    assert streamed == spec.output_token_ids
    assert [e.finish_reason for e in result.events if e.seq_id == "s" and e.finish_reason] == [FinishReason.ERROR]
    assert engine.scheduler.kv.num_in_use == 0 and backend.num_live == 0
