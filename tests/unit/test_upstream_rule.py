"""Upstream's own tick-policy tables, as data, against the pure rule (docs/upstream.md).

Every boolean state (speculative pending, yielded, chunked, batch empty, batch full, queue
empty, should-preempt) x counters x intervals x mixed step on/off: the choice comes from the
decision table below (first matching row), the next counter from the counter table. Then
upstream's characterisations (the grant disabled is the pre-grant rule; the grant and the
mixed step change nothing else), its walks, the yield flag and the grant order.
"""

from itertools import product

import pytest

from coopsched.core.upstream_rule import (
    MAX_COUNTER,
    Choice,
    UpstreamState,
    decide_upstream,
    grant_due,
    next_grant_index,
    next_yielded,
)

S, D, M, P, I = Choice.SPEC_ROUND, Choice.DECODE, Choice.MIXED, Choice.PREFILL, Choice.IDLE
BOOLS = ("speculative_pending", "yielded", "chunked", "batch_empty", "batch_full", "queue_empty",
         "should_preempt")
COUNTERS = (0, 1, 2, 3, 4, 5, 8, 17)
INTERVALS = (0, 1, 2, 3, 4, 16)

# The rule, top row first: a row matches when every named condition holds. "others" = a chunked
# prompt, decode rows or a queue; "grant_due" = interval > 0 and counter >= interval.
DECISION_TABLE = (
    ({"speculative_pending": True, "others": False}, S),
    ({"speculative_pending": True, "yielded": False}, S),
    ({"chunked": True, "batch_empty": True}, P),
    ({"chunked": True, "mixed_step": True}, M),
    ({"chunked": True, "grant_due": True}, P),
    ({"chunked": True}, D),
    ({"batch_empty": True, "queue_empty": True}, I),
    ({"batch_empty": False, "should_preempt": True}, P),
    ({"batch_empty": False, "batch_full": False, "queue_empty": False}, P),
    ({"batch_empty": False}, D),
    ({}, P),
)
# The rule before the grant and the mixed step: a chunked prompt beside decode rows always decodes.
PRE_GRANT_TABLE = tuple(row for row in DECISION_TABLE if not {"mixed_step", "grant_due"} & set(row[0]))
# (chunked, choice) -> next counter from the counter c; no chunked prompt -> 0 whatever ran
COUNTER_TABLE = {(True, P): lambda c: 0, (True, M): lambda c: 0, (True, D): lambda c: c + 1,
                 (True, S): lambda c: c}


def facts(state: UpstreamState) -> dict:
    others = state.chunked or not state.batch_empty or not state.queue_empty
    return {**state._asdict(), "others": others, "grant_due": grant_due(state)}


def table_choice(table, state: UpstreamState) -> Choice:
    known = facts(state)
    return next(choice for conditions, choice in table if all(known[k] == v for k, v in conditions.items()))


def all_states(mixed: bool, counter: int, interval: int):
    for bits in product((False, True), repeat=len(BOOLS)):
        yield UpstreamState(**dict(zip(BOOLS, bits)), mixed_step=mixed, decode_ticks=counter,
                            grant_interval=interval)


def sweep(mixed_values=(False, True), intervals=INTERVALS):
    for mixed, counter, interval in product(mixed_values, COUNTERS, intervals):
        yield from all_states(mixed, counter, interval)


def test_every_state_gives_the_tables_choice_and_counter():
    seen = 0
    for state in sweep():
        decision = decide_upstream(state)
        assert decision.choice is table_choice(DECISION_TABLE, state), state
        rule = COUNTER_TABLE.get((True, decision.choice)) if state.chunked else (lambda c: 0)
        assert rule is not None, f"{decision.choice} while a prompt is chunked: {state}"
        assert decision.decode_ticks == rule(state.decode_ticks), state
        seen += 1
    assert seen == 128 * len(COUNTERS) * len(INTERVALS) * 2


def test_grant_disabled_is_the_pre_grant_rule_exactly():
    for state in sweep(mixed_values=(False,), intervals=(0,)):
        assert decide_upstream(state).choice is table_choice(PRE_GRANT_TABLE, state), state


def test_the_grant_changes_only_a_decode_beside_a_due_chunked_prompt_into_its_chunk():
    fired = 0
    for state in sweep(mixed_values=(False,), intervals=(1, 2, 3, 4, 16)):
        now, before = decide_upstream(state).choice, table_choice(PRE_GRANT_TABLE, state)
        is_grant = state.chunked and not state.batch_empty and grant_due(state) and before is D
        assert (now is not before) == is_grant, state
        if is_grant:
            assert now is P
            fired += 1
    assert fired > 0


def test_the_mixed_step_changes_only_the_chunked_branch_beside_decode_rows():
    for state in sweep(mixed_values=(True,)):
        with_mixed = decide_upstream(state).choice
        without = decide_upstream(state._replace(mixed_step=False)).choice
        if with_mixed is not without:
            assert with_mixed is M and without in (D, P), state
            assert state.chunked and not state.batch_empty, state
    for state in sweep(mixed_values=(False,)):
        assert decide_upstream(state).choice is not M, state


@pytest.mark.parametrize("state, choice, counter", [
    pytest.param(UpstreamState(batch_full=True, queue_empty=True, decode_ticks=999, grant_interval=16),
                 D, 0, id="fresh-chunked-prompt-starts-at-zero"),
    pytest.param(UpstreamState(speculative_pending=True, chunked=True, decode_ticks=999, grant_interval=4),
                 S, 999, id="round-outranks-a-due-grant-and-keeps-the-counter"),
    pytest.param(UpstreamState(speculative_pending=True, chunked=True, mixed_step=True), S, 0,
                 id="round-outranks-mixed"),
    pytest.param(UpstreamState(speculative_pending=True, yielded=True, chunked=True, queue_empty=True,
                               mixed_step=True), M, 0, id="yielded-round-falls-through-to-mixed"),
    pytest.param(UpstreamState(chunked=True, batch_empty=True, queue_empty=True, mixed_step=True,
                               grant_interval=16), P, 0, id="mixed-without-rows-is-a-prefill"),
    pytest.param(UpstreamState(chunked=True, batch_full=True, queue_empty=True, decode_ticks=MAX_COUNTER,
                               grant_interval=0), D, MAX_COUNTER, id="counter-saturates"),
])
def test_upstream_rows(state, choice, counter):
    assert decide_upstream(state) == (choice, counter)


def walk(state: UpstreamState, ticks: int) -> list[Choice]:
    """Apply each decision as the scheduler does: the counter and the yield flag ride along."""
    out = []
    for _ in range(ticks):
        decision = decide_upstream(state)
        out.append(decision.choice)
        state = state._replace(decode_ticks=decision.decode_ticks,
                               yielded=next_yielded(state.yielded, decision.choice))
    return out


STARVED = UpstreamState(chunked=True, batch_full=True, queue_empty=True)


@pytest.mark.parametrize("interval", range(1, 17))
def test_a_chunked_prompt_beside_decode_rows_gets_a_chunk_every_interval_plus_one(interval):
    choices = walk(STARVED._replace(grant_interval=interval), 1000)
    assert set(choices) == {D, P}
    runs = "".join("d" if c is D else "p" for c in choices).split("p")
    assert choices.index(P) == interval
    assert max(len(r) for r in runs) == interval
    assert choices.count(P) == 1000 // (interval + 1)


def test_interval_zero_starves_the_chunked_prompt_until_the_batch_drains():
    assert walk(STARVED, 1000) == [D] * 1000
    assert decide_upstream(STARVED._replace(batch_empty=True, batch_full=False)).choice is P


def test_the_mixed_step_runs_every_tick_and_the_counter_never_builds():
    state = STARVED._replace(mixed_step=True, grant_interval=16)
    assert walk(state, 1000) == [M] * 1000 and decide_upstream(state).decode_ticks == 0


def test_a_speculative_slice_cannot_starve_the_chunked_prompt():
    state = STARVED._replace(speculative_pending=True, grant_interval=4)
    assert walk(state, 60) == [S, D, S, D, S, D, S, D, S, P] * 6


@pytest.mark.parametrize("before, choice, after", [
    pytest.param(False, S, True, id="round-sets"),
    pytest.param(True, P, False, id="prefill-clears"),
    pytest.param(True, D, False, id="decode-clears"),
    pytest.param(True, M, False, id="mixed-clears"),
    pytest.param(True, I, True, id="idle-keeps-set"),
    pytest.param(False, I, False, id="idle-keeps-clear"),
])
def test_yield_flag(before, choice, after):
    assert next_yielded(before, choice) is after


HIGH, NORMAL, LOW = 0, 1, 2


@pytest.mark.parametrize("entries, winner", [
    pytest.param([], None, id="empty"),
    pytest.param([(NORMAL, 0)], 0, id="one"),
    pytest.param([(NORMAL, 0), (NORMAL, 0)], 0, id="fifo"),
    pytest.param([(NORMAL, 0), (HIGH, 0)], 1, id="lane-first"),
    pytest.param([(HIGH, 0), (NORMAL, 0), (HIGH, 0)], 0, id="earliest-of-the-lane"),
    pytest.param([(LOW, 0), (NORMAL, 0)], 1, id="normal-over-low"),
    pytest.param([(LOW, 0), (LOW, 0), (NORMAL, 0)], 2, id="normal-behind-lows"),
    pytest.param([(HIGH, 0), (NORMAL, 2)], 1, id="overdue-over-lane"),
    pytest.param([(HIGH, 0), (LOW, 2)], 1, id="overdue-low-over-high"),
    pytest.param([(HIGH, 0), (NORMAL, 1)], 0, id="below-the-cap-lane-rules"),
    pytest.param([(NORMAL, 2), (HIGH, 3)], 1, id="most-skipped-overdue-wins"),
    pytest.param([(NORMAL, 2), (LOW, 2)], 0, id="tied-skips-earliest"),
])
def test_grant_order(entries, winner):
    assert next_grant_index(entries) == winner


def test_the_skip_cap_bounds_starvation_behind_fresh_high_entries():
    skips, decisions = 0, 0
    while True:
        decisions += 1
        if next_grant_index([(HIGH, 0), (NORMAL, skips)]) == 1:
            break
        skips += 1
    assert decisions == 3  # the skip cap (2) + 1
