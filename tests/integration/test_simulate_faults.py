"""Faults: each is handled, and each test fails without the handling that guards it.

Two layers: scripted scenarios (one fault, checked tick by tick by harness.sim.invariants),
and planted bugs (tests/plants.py) that `coopsched simulate` must catch, printing a
seed whose one-line replay fails again with the plant and passes without it.
"""

from __future__ import annotations

import re
import shlex

import pytest
from plants import PLANTS, apply

from coopsched import cli
from coopsched.clock import ManualClock
from coopsched.core import FinishReason, Request, Scheduler, SchedulerConfig
from coopsched.executor import BackendError
from harness.sim.faults import ANY, Fault, FaultyBackend, InjectedFault
from harness.sim.invariants import Checked, InvariantError
from mocks import CostModel, MockBackend, MockDrafter, MockTarget, oracle

PROMPT = tuple(range(65, 71))


def make_checked(**overrides) -> Checked:
    clock = ManualClock()
    mock = MockBackend(clock, CostModel.simple(5.0, 30.0, 0.2), MockTarget(), MockDrafter(0.6, seed=1))
    faulty = FaultyBackend(mock)
    checked = Checked(Scheduler(SchedulerConfig(**overrides)), faulty, mock, clock)
    faulty.on_disconnect = checked.cancel
    return checked


def submit(checked: Checked, *specs: tuple[str, bool], max_tokens: int = 12) -> None:
    for seq_id, speculative in specs:
        checked.submit(Request(seq_id, PROMPT + (len(seq_id),), max_tokens, speculative=speculative))


def outcome(checked: Checked) -> dict[str, FinishReason]:
    checked.drain(max_ticks=500)
    assert checked.scheduler.kv.num_in_use == 0 and checked.mock.num_live == 0
    return {i: r.finish_reason for i, r in checked.submitted.items()}


def assert_reference(checked: Checked, *seq_ids: str) -> None:
    for seq_id in seq_ids:
        request = checked.submitted[seq_id]
        assert (request.output_token_ids, request.finish_reason) == oracle.expected(checked.mock.target, request)


# -- scripted faults ------------------------------------------------------------
@pytest.mark.parametrize("contained", [True, False], ids=["handled", "planted-no-handling"])
def test_backend_error_for_one_row_of_a_batched_decode(contained, monkeypatch):
    if not contained:
        apply("error-not-contained", monkeypatch)
    checked = make_checked()
    submit(checked, ("a", False), ("b", False), ("c", False))
    checked.faulty.arm(Fault("raise", "decode", "b"))
    if not contained:
        with pytest.raises(BackendError, match="injected decode failure for 'b'"):
            checked.drain(max_ticks=50)
        return
    assert outcome(checked) == {"a": FinishReason.LENGTH, "b": FinishReason.ERROR, "c": FinishReason.LENGTH}
    assert "injected decode failure" in checked.submitted["b"].error
    assert_reference(checked, "a", "c")


@pytest.mark.parametrize("guarded", [True, False], ids=["handled", "planted-no-guard"])
def test_a_plain_exception_fails_only_the_rows_of_its_call(guarded, monkeypatch):
    """A speculative request keeps going while a decode over the classic rows raises."""
    if not guarded:
        apply("plain-exception-escapes", monkeypatch)
    checked = make_checked()
    submit(checked, ("s", True), ("a", False), ("b", False))
    checked.faulty.arm(Fault("generic", "decode", "a"))
    if not guarded:
        with pytest.raises(InjectedFault):
            checked.drain(max_ticks=50)
        return
    assert outcome(checked) == {"s": FinishReason.LENGTH, "a": FinishReason.ERROR, "b": FinishReason.ERROR}
    assert checked.submitted["s"].served_speculatively
    assert_reference(checked, "s")


@pytest.mark.parametrize("contained", [True, False], ids=["handled", "planted-no-handling"])
def test_a_drafter_that_raises_fails_its_window_and_spares_classic_rows(contained, monkeypatch):
    if not contained:
        apply("drafter-error-not-contained", monkeypatch)
    checked = make_checked(enable_batch=True)
    submit(checked, ("w1", True), ("w2", True), ("c", False))
    checked.faulty.arm(Fault("generic", "draft", ANY, persistent=True))
    if not contained:
        with pytest.raises(BackendError, match="injected draft failure"):
            checked.drain(max_ticks=50)
        return
    assert outcome(checked) == {"w1": FinishReason.ERROR, "w2": FinishReason.ERROR, "c": FinishReason.LENGTH}
    assert_reference(checked, "c")
    assert checked.submitted["w1"].output_token_ids  # slice 0's token was streamed before the failure


@pytest.mark.parametrize("fixed", [True, False], ids=["handled", "planted-old-order"])
def test_a_failed_prefill_in_a_window_loses_no_sibling_token(fixed, monkeypatch):
    """Row 2's prefill fails: row 1 retries its slice 0 and finishes with the reference tokens."""
    if not fixed:
        apply("window-commits-early", monkeypatch)
    checked = make_checked(enable_batch=True)
    submit(checked, ("w1", True), ("w2", True))
    checked.faulty.arm(Fault("raise", "prefill", "w2"))
    if not fixed:
        with pytest.raises(InvariantError, match="w1: streamed"):
            checked.drain(max_ticks=50)
        return
    assert outcome(checked) == {"w1": FinishReason.LENGTH, "w2": FinishReason.ERROR}
    assert_reference(checked, "w1")


@pytest.mark.parametrize("fixed", [True, False], ids=["handled", "planted-keeps-progress"])
def test_a_failed_chunk_of_a_window_restarts_every_sibling_from_its_first_token(fixed, monkeypatch):
    """Chunked slice 0 of a window: row 2's second chunk fails; row 1 prefills again from scratch."""
    if not fixed:
        apply("chunk-progress-kept", monkeypatch)
    checked = make_checked(enable_batch=True, prefill_chunk_tokens=4)
    submit(checked, ("w1", True), ("w2", True))  # 7-token prompts: chunks of 4 + 3 per row
    checked.faulty.arm(Fault("raise", "prefill", "w2", skip=1))
    if not fixed:
        with pytest.raises(InvariantError, match=r"no progress: \['w1'\]"):  # its first token is lost
            checked.drain(max_ticks=80)
        return
    assert outcome(checked) == {"w1": FinishReason.LENGTH, "w2": FinishReason.ERROR}
    assert_reference(checked, "w1")


def test_a_failed_row_of_a_batched_prefill_ends_alone_and_its_batch_retries():
    checked = make_checked(max_batch_prefill=3, prefill_chunk_tokens=5)
    submit(checked, ("a", False), ("b", False), ("c", False))
    checked.faulty.arm(Fault("raise", "prefill", "b", skip=1))  # the second prefill call: a, b and c chunks
    assert outcome(checked) == {"a": FinishReason.LENGTH, "b": FinishReason.ERROR, "c": FinishReason.LENGTH}
    assert_reference(checked, "a", "c")
    assert checked.kinds["chunk"] >= 3


@pytest.mark.parametrize("fixed", [True, False], ids=["handled", "planted-drops-rounds"])
def test_a_failure_late_in_a_legacy_burst_keeps_the_rounds_before_it(fixed, monkeypatch):
    if not fixed:
        apply("burst-drops-earlier-rounds", monkeypatch)
    checked = make_checked(mode="burst")
    checked.mock.drafter.scripts["s"] = [0, 0, 0]  # every round emits one token
    submit(checked, ("s", True), max_tokens=30)
    checked.faulty.arm(Fault("raise", "verify", "s", skip=2))  # the third round fails
    if not fixed:
        with pytest.raises(InvariantError, match="s: streamed"):
            checked.drain(max_ticks=50)
        return
    assert outcome(checked) == {"s": FinishReason.ERROR}
    assert checked.submitted["s"].output_token_ids == checked.streamed["s"]
    assert len(checked.streamed["s"]) == 3  # slice 0 + two rounds of one token each


@pytest.mark.parametrize("handled", [True, False], ids=["handled", "planted-ignores-cancel"])
def test_a_client_vanishing_between_draft_and_verify_stops_at_the_next_round(handled, monkeypatch):
    if not handled:
        apply("cancel-ignored-in-round", monkeypatch)
    checked = make_checked()
    submit(checked, ("s", True), ("c", False), max_tokens=20)
    checked.faulty.arm(Fault("disconnect", "verify", "s"))
    if not handled:
        with pytest.raises(InvariantError, match="after its cancel took effect"):
            checked.drain(max_ticks=100)
        return
    assert outcome(checked) == {"s": FinishReason.STOP, "c": FinishReason.LENGTH}
    calls = checked.faulty.num_calls
    assert calls["draft", "s"] == calls["verify", "s"] >= 1  # the round after the disconnect drafted nothing
    assert_reference(checked, "c")


@pytest.mark.parametrize("handled", [True, False], ids=["handled", "planted-row-left-in-batch"])
def test_a_classic_row_cancelled_between_ticks_is_not_decoded_again(handled, monkeypatch):
    if not handled:
        apply("cancelled-row-decoded", monkeypatch)
    checked = make_checked()
    submit(checked, ("a", False), ("b", False))
    for _ in range(3):
        checked.step()
    checked.cancel("a")
    if not handled:
        with pytest.raises((InvariantError, KeyError)):
            checked.drain(max_ticks=50)
        return
    assert outcome(checked) == {"a": FinishReason.STOP, "b": FinishReason.LENGTH}


@pytest.mark.parametrize("handled", [True, False], ids=["handled", "planted-admits-without-slot"])
def test_kv_exhaustion_makes_admission_wait(handled, monkeypatch):
    if not handled:
        apply("admission-ignores-kv", monkeypatch)
    checked = make_checked(num_kv_slots=2)
    submit(checked, ("a", False), ("b", True), ("c", False), ("d", True))
    if not handled:
        with pytest.raises(RuntimeError, match="KV slot pool exhausted"):
            checked.drain(max_ticks=50)
        return
    assert set(outcome(checked).values()) == {FinishReason.LENGTH}
    assert checked.kv_full_ticks > 0
    assert_reference(checked, "a", "b", "c", "d")


# -- planted bugs vs `coopsched simulate` ---------------------------------------
def _simulate(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(["simulate", *argv, "--jobs", "1", "--no-progress"])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("plant", [name for name, (_, mix) in PLANTS.items() if mix is not None])
def test_simulate_catches_the_plant_and_its_seed_replays(plant, monkeypatch, capsys):
    faults = apply(plant, monkeypatch)
    code, out = _simulate(capsys, "--seeds", "200", "--faults", faults)
    assert code == 1, out
    seed, message = re.search(r"FAIL seed (\d+): (.*)", out).groups()
    replay = re.search(r"replay: (coopsched simulate .*)", out).group(1)
    assert replay == f"coopsched simulate --seeds 1 --start {seed} --faults {faults}"
    code, again = _simulate(capsys, *shlex.split(replay)[2:])
    assert code == 1 and f"FAIL seed {seed}: {message}" in again
    monkeypatch.undo()  # the same seed passes once the handling is back
    code, clean = _simulate(capsys, *shlex.split(replay)[2:])
    assert code == 0, clean


def test_a_failure_after_a_window_row_ended_leaves_that_row_alone():
    """Seed 4770's shape: a window row ends (cancelled), then a later round fails for its sibling. The
    ended row gets no second finish event and is not booked as speculative work: it left the books."""
    checked = make_checked(enable_batch=True, mode="slice")
    checked.submit(Request("a", PROMPT, 12))
    checked.submit(Request("b", PROMPT, 12))  # same shape: one window
    checked.step()  # slice 0 of the window
    checked.step()  # round 1
    checked.cancel("a")
    checked.step()  # round 2 stops "a" before its draft
    assert checked.finished["a"] is FinishReason.STOP
    checked.faulty.arm(Fault("raise", "verify", "b"))
    finished = outcome(checked)
    assert finished == {"a": FinishReason.STOP, "b": FinishReason.ERROR}


@pytest.mark.parametrize("fixed", [True, False], ids=["handled", "planted-chunk-dropped"])
def test_a_mixed_tick_whose_decode_fails_keeps_its_chunk(fixed, monkeypatch):
    """The chunk ran before the decode row failed: the prompt's progress (its cache) stands."""
    import coopsched.core.scheduler as scheduler_module
    if not fixed:
        monkeypatch.setattr(scheduler_module, "append_prefills", lambda *args, **kwargs: None)
    checked = make_checked(mode="slice", prefill_chunk_tokens=3, mixed_step=True, prefill_grant_interval=0)
    submit(checked, ("a", False), ("bb", False))
    checked.faulty.arm(Fault("raise", "decode", "a"))  # a's first decode: the mixed tick beside bb's chunk
    if not fixed:  # bb's chunk is planned again on a cache that holds it
        with pytest.raises(InvariantError, match="cache holds 6 tokens"):
            outcome(checked)
        return
    result = outcome(checked)
    assert result == {"a": FinishReason.ERROR, "bb": FinishReason.LENGTH} and checked.kinds["error"] == 1
    assert_reference(checked, "bb")
