"""decide_action as a table (docs/architecture.md, the tick loop), and the yield flag."""

import pytest

from coopsched.core.policy import ActionKind, TickState, decide_action, next_yield_flag

P, D, S, I = ActionKind.PREFILL, ActionKind.DECODE, ActionKind.SPEC_ROUND, ActionKind.IDLE


@pytest.mark.parametrize("state, expected", [
    pytest.param(TickState(), I, id="nothing-anywhere"),
    pytest.param(TickState(last_was_spec=True), I, id="idle-even-after-spec"),
    pytest.param(TickState(num_admissible=1), P, id="queue-only"),
    pytest.param(TickState(num_running=2), D, id="batch-only"),
    pytest.param(TickState(num_running=2, num_admissible=1), P, id="admission-before-decode"),
    pytest.param(TickState(num_running=8, max_batch_size=8, num_admissible=1), D, id="full-batch-decodes"),
    pytest.param(TickState(has_chunked_prefill=True), P, id="chunked-prefill-under-way"),
    pytest.param(TickState(has_spec_work=True), S, id="spec-alone"),
    pytest.param(TickState(has_spec_work=True, last_was_spec=True), S, id="spec-alone-back-to-back"),
    pytest.param(TickState(has_spec_work=True, num_running=1), S, id="spec-turn-under-contention"),
    pytest.param(TickState(has_spec_work=True, num_running=1, last_was_spec=True), D, id="classic-turn-decode"),
    pytest.param(TickState(has_spec_work=True, num_admissible=1, last_was_spec=True), P, id="classic-turn-prefill"),
    pytest.param(TickState(has_spec_work=True, has_chunked_prefill=True, last_was_spec=True), P,
                 id="classic-turn-parked-prefill"),
    pytest.param(TickState(has_spec_work=True, num_running=1, num_admissible=0, last_was_spec=False), S,
                 id="kv-full-queue-is-no-work"),
    # chunked prefill: a prefill under way goes on beside decode rows, one prefill tick per gap
    pytest.param(TickState(num_running=2, has_chunked_prefill=True), P, id="chunk-goes-on-beside-decode"),
    pytest.param(TickState(num_running=2, has_chunked_prefill=True, prefill_yields=True), D,
                 id="decode-after-a-chunk"),
    pytest.param(TickState(num_running=2, num_admissible=3, prefill_yields=True), D, id="decode-after-an-admission"),
    pytest.param(TickState(num_admissible=3, prefill_yields=True), P, id="no-decode-rows-no-yield"),
    pytest.param(TickState(has_spec_work=True, num_running=1, has_chunked_prefill=True, last_was_spec=True), P,
                 id="chunk-after-a-round"),
    pytest.param(TickState(has_spec_work=True, num_running=1, has_chunked_prefill=True, last_was_spec=True,
                           prefill_yields=True), D, id="round-and-chunk-then-decode"),
])
def test_decide_action(state, expected):
    assert decide_action(state) is expected


@pytest.mark.parametrize("before, action, after", [
    pytest.param(False, S, True, id="round-sets"),
    pytest.param(True, P, False, id="prefill-clears"),
    pytest.param(True, D, False, id="decode-clears"),
    pytest.param(True, ActionKind.FUSED, False, id="fused-clears"),
    pytest.param(True, I, True, id="idle-keeps-set"),
    pytest.param(False, I, False, id="idle-keeps-clear"),
])
def test_yield_flag(before, action, after):
    assert next_yield_flag(before, action) is after


def test_rounds_and_classic_actions_strictly_alternate_under_contention():
    flag, seen = False, []
    for _ in range(6):
        action = decide_action(TickState(has_spec_work=True, num_running=1, last_was_spec=flag))
        seen.append(action)
        flag = next_yield_flag(flag, action)
    assert seen == [S, D, S, D, S, D]
