"""Fused mode: the policy table, the mock's fused forward, exact gaps, parity, HOL books."""

import pytest
from factories import make_backend, make_engine, serve_both_ways, token_times

from coopsched.clock import ManualClock
from coopsched.core import Request, SamplingParams
from coopsched.core.modes.fused import decide_fused
from coopsched.core.policy import ActionKind, TickState, decide_action
from mocks import CostModel

P, D, S, F, I = (ActionKind.PREFILL, ActionKind.DECODE, ActionKind.SPEC_ROUND, ActionKind.FUSED,
                 ActionKind.IDLE)
COST = CostModel()  # decode 5 ms at B = 1, +0.5 ms a row; draft 2 ms a token; verify(4) 14 ms
K = 4


@pytest.mark.parametrize("state, expected", [
    pytest.param(TickState(), I, id="nothing-anywhere"),
    pytest.param(TickState(num_running=2), D, id="no-spec-decodes"),
    pytest.param(TickState(num_running=2, num_admissible=1), P, id="no-spec-admission-first"),
    pytest.param(TickState(has_spec_work=True), S, id="spec-alone-back-to-back"),
    pytest.param(TickState(has_spec_work=True, last_was_spec=True), S, id="spec-alone-ignores-flag"),
    pytest.param(TickState(has_spec_work=True, num_running=1), F, id="contention-fuses"),
    pytest.param(TickState(has_spec_work=True, num_running=1, last_was_spec=True), F, id="no-alternation"),
    pytest.param(TickState(has_spec_work=True, num_running=1, num_admissible=1), P,
                 id="admission-before-fused"),
    pytest.param(TickState(has_spec_work=True, num_admissible=1), P, id="admission-before-lone-round"),
    pytest.param(TickState(has_spec_work=True, num_running=8, max_batch_size=8, num_admissible=1), F,
                 id="full-batch-fuses"),
    pytest.param(TickState(has_spec_work=True, num_running=1, spec_prefilling=True), S, id="chunk-of-slice0"),
    pytest.param(TickState(has_spec_work=True, num_running=1, spec_prefilling=True, last_was_spec=True), D,
                 id="decode-between-slice0-chunks"),
    pytest.param(TickState(has_spec_work=True, spec_prefilling=True, last_was_spec=True), S,
                 id="slice0-chunks-alone-back-to-back"),
    pytest.param(TickState(has_spec_work=True, num_running=1, has_chunked_prefill=True, prefill_yields=True), F,
                 id="fused-after-a-classic-chunk"),
])
def test_decide_fused(state, expected):
    assert decide_fused(state) is expected


def test_without_spec_work_fused_policy_is_the_reference_policy():
    for running in (0, 1, 8):
        for admissible in (0, 1):
            state = TickState(num_running=running, num_admissible=admissible)
            assert decide_fused(state) is decide_action(state)


def _two_backends():
    """Two identical mocks, each with a classic row and a speculative row prefilled."""
    out = []
    for _ in range(2):
        backend = make_backend(ManualClock(), cost=COST, accept_prob=0.5)
        backend.prefill("c", (65, 66, 67), SamplingParams(), False)
        backend.prefill("s", (70, 71), SamplingParams(), True)
        out.append(backend)
    return out


def test_mock_fused_equals_decode_plus_verify_and_costs_one_forward_of_the_combined_width():
    apart, fused = _two_backends()
    drafts = [68, 69, 70]
    decoded = apart.decode([("c", 80)])
    verified = apart.verify([("s", 81, drafts)])
    before = fused.clock.now()
    assert fused.fused([("c", 80)], [("s", 81, drafts)]) == (decoded, verified)
    assert fused.clock.now() - before == COST.decode(1 + 4)  # one classic row + K verify positions
    assert fused._seqs == apart._seqs  # same caches after the tick (so rewind works the same)


def _classic_and_spec(classic_tokens=60, spec_tokens=40, spec_arrival=20.0, **spec_kwargs):
    classic = Request("classic", tuple(range(65, 81)), classic_tokens, speculative=False)
    spec = Request("spec", tuple(range(70, 102)), spec_tokens, arrival_ms=spec_arrival, **spec_kwargs)
    return [classic, spec]


def test_every_classic_gap_is_one_fused_step_except_the_admission():
    sched = make_engine(make_backend(cost=COST), mode="fused")
    result = sched.run(_classic_and_spec())
    step = COST.draft(K - 1) + COST.decode(1 + K)
    gaps = [b - a for a, b in zip(token_times(result)["classic"], token_times(result)["classic"][1:])]
    fused_ticks = [t for t in result.ticks if t.action == "fused"]
    assert fused_ticks and all(t.wall_ms == pytest.approx(step) for t in fused_ticks)
    over = [g for g in gaps if g > COST.decode(1) + 1e-9]
    # the spec's slice 0 is a prefill and runs alone once; every other gap with speculation is one fused step
    assert over.count(pytest.approx(COST.slice0(32) + step)) == 1
    assert all(g == pytest.approx(step) for g in over if g != pytest.approx(COST.slice0(32) + step))
    assert not any(t.action == "spec_round" for t in result.ticks if t.start_ms < fused_ticks[-1].end_ms)


@pytest.mark.parametrize("accept_prob", [0.0, 0.5, 1.0], ids=["all-miss", "half", "all-accept"])
@pytest.mark.parametrize("batched", [False, True], ids=["b1", "window"])
def test_fused_parity_with_speculation_off(accept_prob, batched):
    spec, classic, _, result = serve_both_ways(lambda: make_engine(
        make_backend(cost=COST, accept_prob=accept_prob), mode="fused", enable_batch=batched))
    assert any(t.action == "fused" for t in result.ticks)
    assert any(t.kind.detail == "window" for t in result.ticks) == batched
    assert spec == classic


def test_a_cancelled_spec_row_still_lets_the_classic_rows_decode_in_that_tick():
    engine = make_engine(make_backend(cost=COST), mode="fused")
    sched = engine.scheduler
    reqs = _classic_and_spec(classic_tokens=30, spec_tokens=200, spec_arrival=0.0)
    for r in reqs:
        sched.submit(r)
    while engine.step().record.action != "fused":
        pass
    sched.cancel("spec")
    before = len(reqs[0].output_token_ids)
    while sched.has_work:
        engine.step()
    assert reqs[1].finish_reason.value == "stop" and reqs[0].finish_reason.value == "length"
    assert len(reqs[0].output_token_ids) == 30 > before
    assert sched.kv.num_in_use == 0 and engine.executor.backend.num_live == 0


def test_rows_decoded_in_a_fused_tick_are_not_hol_waiters_but_queued_requests_are():
    sched = make_engine(make_backend(cost=COST), mode="fused")
    sched.run(_classic_and_spec())
    (record,) = sched.scheduler.obs.bursts
    assert record.hol_waiters == 1  # only at slice 0 (a prefill tick the classic row waited out)
    waits = sched.scheduler.obs.hol_wait_ms
    assert list(waits.elements()) == [pytest.approx(COST.slice0(32))]  # one wait, flushed by the next fused tick
