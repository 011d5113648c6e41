"""The mlx-lm twin in virtual time: batch caps, prefill batches and steps, admission in waves, the
single stream under a draft model. Each rule's check is also shown failing on a model that breaks it."""

from __future__ import annotations

from itertools import pairwise

import pytest

from coopsched.clock import ManualClock
from coopsched.core import Request, SchedulerConfig
from coopsched.core.types import ActionKind
from coopsched.engine import Engine
from coopsched.twins import make_scheduler
from coopsched.twins.mlxlm import MlxLmModel
from mocks import CostModel, MockBackend, MockDrafter, MockTarget

FIXED_MS, PER_TOKEN_MS, DECODE_MS, ROUND_MS = 3.0, 0.5, 2.0, 6.0
COST = CostModel(prefill_fixed_ms=FIXED_MS, prefill_per_token_ms=PER_TOKEN_MS, draft_prefill_per_token_ms=0.0,
                 decode_ms=[[1, DECODE_MS]], draft_per_token_ms=0.0, verify_ms=[[1, ROUND_MS]])


def run(requests: list[Request], **params):
    """Per request its token times, and the ticks, on flat costs (a prefill forward 3 ms + 0.5 ms a
    token, a decode step 2 ms, a round 6 ms)."""
    clock = ManualClock()
    backend = MockBackend(clock, COST, MockTarget(), MockDrafter(0.7, seed=0))
    model = make_scheduler("mlx-lm", SchedulerConfig(num_kv_slots=64), params)
    times: dict[str, list[float]] = {}
    engine = Engine(model, backend, clock,
                    on_event=lambda e: times.setdefault(e.seq_id, []).extend([e.time_ms] * len(e.token_ids)))
    return times, engine.run(requests).ticks


def req(name: str, arrival_ms: float = 0.0, prompt_len: int = 8, max_tokens: int = 10) -> Request:
    return Request(name, tuple(65 + i % 26 for i in range(prompt_len)), max_tokens, arrival_ms=arrival_ms)


def model_ticks(ticks):
    return [t for t in ticks if t.action is not ActionKind.IDLE]


# -- the checks, each shown failing below on the model it guards against ---------------------------
def check_lone(times) -> None:
    """A lone request: its prompt priced once (the three forwards calibration timed as one TTFT)."""
    t = times["a"]
    assert t[0] == pytest.approx(FIXED_MS + 8 * PER_TOKEN_MS)
    assert all(b - a == pytest.approx(DECODE_MS) for a, b in pairwise(t))


def check_cap(ticks, cap: int) -> None:
    assert max(len(t.request_ids) for t in model_ticks(ticks)) <= cap + 1  # + one row's first-token span
    decoding = [sum(1 for _ in t.request_ids) for t in model_ticks(ticks) if t.action is ActionKind.DECODE]
    assert max(decoding) == cap


def check_wave(times, wave_ms: float) -> None:
    """b arrives 1 ms after a was inserted: it joins only once a's wave has run wave_ms."""
    assert times["b"][0] > wave_ms


def check_chained_budget(times, wave_ms: float) -> None:
    """b arrives after a's first budget ran out with nothing queued: mlx-lm started the next budget
    then, so b waits for that one's end (three steps later its span) instead of joining at once."""
    second_end = 203.0  # a's steps end at 7 + 2k ms: the first past 100 is 101, the first past 201 is 203
    assert wave_ms == 100.0
    assert times["b"][0] == pytest.approx(second_end + 2 * DECODE_MS + FIXED_MS + 8 * PER_TOKEN_MS + DECODE_MS)


def check_serial(times) -> None:
    assert times["b"][0] > times["a"][-1]


# -- the rules -------------------------------------------------------------------------------------
def test_a_lone_request_is_its_calibrated_ttft_then_decode_steps():
    times, _ = run([req("a")])
    check_lone(times)


def test_decode_concurrency_caps_the_generation_batch():
    times, ticks = run([req(f"r{i}", max_tokens=20) for i in range(5)], decode_concurrency=3,
                       prompt_concurrency=1)
    check_cap(ticks, 3)
    # the rows past the cap wait for a row to finish: r3 starts after r0 ended
    assert times["r3"][0] > times["r0"][-1]


def test_prompt_concurrency_is_how_many_join_per_step():
    together, _ = run([req(f"r{i}") for i in range(3)], prompt_concurrency=8)
    one_by_one, _ = run([req(f"r{i}") for i in range(3)], prompt_concurrency=1)
    assert len({t[0] for t in together.values()}) == 1  # one prefill forward, one first-token step
    firsts = sorted(t[0] for t in one_by_one.values())
    assert firsts[0] < firsts[1] < firsts[2]


def test_prefill_step_size_chunks_all_but_the_last_chunk_before_the_first_token():
    times, ticks = run([req("a", prompt_len=8)], prefill_step_size=3)
    spans = [t.prefill_tokens for t in model_ticks(ticks)[:2]]
    assert spans == [(3,), (3,)]  # 7 positions before the last in chunks of 3: two, and the third ...
    assert times["a"][0] == pytest.approx(3 * FIXED_MS + 8 * PER_TOKEN_MS)  # ... priced with the first token


def test_requests_join_a_busy_server_in_waves():
    times, _ = run([req("a", max_tokens=400), req("b", arrival_ms=1.0)], wave_ms=100.0)
    check_wave(times, 100.0)
    idle, _ = run([req("a", max_tokens=400), req("b", arrival_ms=1.0)], wave_ms=0.0)
    # no budget: inserted when a's first step ends (7 ms), then its chunk and move steps (a's decodes,
    # 2 ms each), then its span with a's decode (3 + 4 + 2 ms)
    assert idle["b"][0] == pytest.approx(7.0 + 2 * DECODE_MS + FIXED_MS + 8 * PER_TOKEN_MS + DECODE_MS)


def test_a_busy_server_restarts_its_time_budget_whether_or_not_anything_queued():
    times, _ = run([req("a", max_tokens=400), req("b", arrival_ms=150.0)], wave_ms=100.0)
    check_chained_budget(times, 100.0)


def test_a_draft_model_serves_one_request_at_a_time_in_rounds():
    times, ticks = run([req("a", max_tokens=12), req("b", max_tokens=12)], draft_model=True, num_draft_tokens=3)
    check_serial(times)
    rounds = [t for t in model_ticks(ticks) if t.action is ActionKind.SPEC_ROUND]
    assert rounds and all(len(t.request_ids) == 1 for t in rounds)
    assert len(times["a"]) == len(times["b"]) == 12


@pytest.mark.parametrize(("params", "says"), [
    ({"max_num_seqs": 8}, "unknown for a mlx-lm server"),
    ({"decode_concurrency": 0}, "decode_concurrency=0"),
    ({"wave_ms": -1}, "wave_ms=-1"),
], ids=["unknown", "zero-cap", "negative-wave"])
def test_bad_params_are_refused_by_name(params, says):
    with pytest.raises(ValueError, match=says):
        MlxLmModel(SchedulerConfig(), params)


# -- planted regressions: each check fails on the model it guards against ----------------------------
def test_check_lone_catches_the_last_chunk_priced_in_its_own_step(monkeypatch):
    """A twin that ran every prompt forward where mlx-lm does: the lone TTFT pays two fixed costs."""
    def eager(self, prompting):
        spans = []
        for request in prompting:
            row = self._rows[request.id]
            if row.chunk_steps == 0:
                row.generating = True
                continue
            row.chunk_steps -= 1
            spans.append(self.span(request, len(request.prompt_token_ids) - 1 - request.num_prefilled))
        return spans
    monkeypatch.setattr(MlxLmModel, "_prompt_step", eager)
    times, _ = run([req("a")])
    with pytest.raises(AssertionError):
        check_lone(times)


def test_check_cap_catches_an_uncapped_batch(monkeypatch):
    monkeypatch.setattr(MlxLmModel, "cap", property(lambda self: 10**6))
    _, ticks = run([req(f"r{i}", max_tokens=20) for i in range(5)], decode_concurrency=3, prompt_concurrency=1)
    with pytest.raises(AssertionError):
        check_cap(ticks, 3)


def test_check_wave_catches_admission_at_once(monkeypatch):
    monkeypatch.setattr(MlxLmModel, "wave_ms", property(lambda self: 0.0))
    times, _ = run([req("a", max_tokens=400), req("b", arrival_ms=1.0)], wave_ms=100.0)
    with pytest.raises(AssertionError):
        check_wave(times, 100.0)


def test_check_chained_budget_catches_a_budget_started_only_by_an_insertion(monkeypatch):
    """The rule before: a busy server's budget clock restarted only when it inserted a request, so a
    request arriving more than wave_ms after the last insertion joined at the next step."""
    def on_insertion_only(self):
        now = max([self._now_ms, *(r.arrival_ms for r in self.waiting)])
        queued = [r for r in self.waiting if r not in self._inserted]
        if queued and ((not self._rows and not self._inserted) or now - self._wave_start_ms > self.wave_ms):
            self._wave_start_ms = now
            self._inserted += queued
    monkeypatch.setattr(MlxLmModel, "_insert_wave", on_insertion_only)
    times, _ = run([req("a", max_tokens=400), req("b", arrival_ms=150.0)], wave_ms=100.0)
    with pytest.raises(AssertionError):
        check_chained_budget(times, 100.0)


def test_check_serial_catches_batching_under_a_draft_model(monkeypatch):
    monkeypatch.setattr(MlxLmModel, "speculates", property(lambda self: False))
    times, _ = run([req("a", max_tokens=12), req("b", max_tokens=12)], draft_model=True)
    with pytest.raises(AssertionError):
        check_serial(times)


def test_the_batch_is_not_capped_by_coopsched_slots():
    """mlx_lm.server holds no KV slots: 20 requests decode together under a config of 16 slots."""
    clock = ManualClock()
    backend = MockBackend(clock, COST, MockTarget(), MockDrafter(0.7, seed=0))
    model = MlxLmModel(SchedulerConfig(num_kv_slots=16), {"prompt_concurrency": 20})
    ticks = Engine(model, backend, clock).run([req(f"r{i}", max_tokens=20) for i in range(20)]).ticks
    assert max(len(t.request_ids) for t in model_ticks(ticks) if t.action is ActionKind.DECODE) == 20
