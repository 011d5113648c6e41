"""The llama.cpp step model in virtual time: slots, prompts in the generating slots' batch under
n_batch, one draft call for every generating slot, the per-slot draft cap. Each rule's check is
shown to fail on a model with that rule planted wrong."""

from __future__ import annotations

from dataclasses import replace

import pytest
from factories import make_backend

from coopsched.clock import ManualClock
from coopsched.core import Request, SchedulerConfig
from coopsched.engine import Engine
from coopsched.twins import make_scheduler
from coopsched.twins.llamacpp import LlamaCppModel
from mocks import CostModel, MockBackend

# flat prices, so every step's length is a sum of terms: prefill 2 + 0.5 a token, any decode or
# verify forward 5, a draft call 1 a drafted position
COST = CostModel(prefill_fixed_ms=2.0, prefill_per_token_ms=0.5, draft_prefill_per_token_ms=0.0,
                 decode_ms=[[1, 5.0]], draft_per_token_ms=1.0, verify_ms=[[1, 5.0]])


class RecordingBackend:
    """The mock, recording each draft call's (rows, drafted tokens per row)."""

    def __init__(self, accept_prob: float, cost: CostModel = COST) -> None:
        self.mock = make_backend(ManualClock(), cost=cost, accept_prob=accept_prob)
        self.drafts: list[tuple[int, int]] = []

    def __getattr__(self, name):
        return getattr(self.mock, name)

    def draft(self, rows, num_tokens):
        self.drafts.append((len(rows), num_tokens))
        return self.mock.draft(rows, num_tokens)


def prompt(n: int, salt: int = 0) -> tuple[int, ...]:
    return tuple(65 + (salt + i) % 26 for i in range(n))


def simulate(requests, drafter: bool = False, accept_prob: float = 1.0, cost: CostModel = COST, **params):
    """Per request its token times; and the draft calls."""
    config = SchedulerConfig(has_drafter=drafter, block_size=params.get("spec_draft_n_max", 3) + 1)
    backend = RecordingBackend(accept_prob, cost)
    model = make_scheduler("llama.cpp", config, params)
    result = Engine(model, backend, backend.mock.clock).run(requests)
    times: dict[str, list[float]] = {r.id: [] for r in requests}
    for event in result.events:
        times[event.seq_id] += [event.time_ms] * len(event.token_ids)
    assert backend.num_live == 0 and model.kv.num_in_use == 0
    return times, backend.drafts


def three_at_once() -> list[Request]:
    return [Request(f"r{i}", prompt(8, i), 4) for i in range(3)]


def check_waits_for_a_slot(times) -> None:
    # two slots: both prompts in one forward (2 + 0.5 x 16), three decode steps; the third request
    # takes the first slot freed, at 25, and prefills alone (2 + 0.5 x 8)
    assert times["r0"] == times["r1"] == [10.0, 15.0, 20.0, 25.0]
    assert times["r2"] == [31.0, 36.0, 41.0, 46.0]


def late_long_prompt() -> list[Request]:
    return [Request("r0", prompt(8), 6), Request("r1", prompt(40, 5), 2, arrival_ms=12.0)]


def check_prompt_joins_the_step(times) -> None:
    # r1 arrives during r0's third step; from 16 each step holds r0's token and 15 of r1's prompt
    # tokens (n_batch 16): prefill 2 + 7.5, decode 5; the last 10 prompt tokens 2 + 5, decode 5
    assert times["r0"] == [6.0, 11.0, 16.0, 30.5, 45.0, 57.0]
    assert times["r1"] == [57.0, 62.0]


def two_drafting() -> list[Request]:
    return [Request(f"r{i}", prompt(8, i), 9) for i in range(2)]


def check_one_draft_call_for_every_slot(times, drafts) -> None:
    # both prompts (10 ms), then two steps of one draft call (3 drafts, 3 ms) and one verify (5 ms)
    # for both rows, every draft accepted: 4 tokens a row a step
    assert drafts == [(2, 3), (2, 3)]
    assert times["r0"] == times["r1"] == [10.0] + [18.0] * 4 + [26.0] * 4


def plant_no_slots(mp) -> None:
    """Every waiting request is launched at once, as if the server had a slot for each."""
    def launch_all(self):
        for request in list(self.waiting):
            self.admit(request)
            self._slot_of[request.id] = len(self._slot_of)
    mp.setattr(LlamaCppModel, "_launch", launch_all)


def plant_prompt_alone(mp) -> None:
    """Prompts only in a step without generating slots (no continuous batching)."""
    spans = LlamaCppModel._prompt_spans
    mp.setattr(LlamaCppModel, "_prompt_spans", lambda self, used: spans(self, used) if used == 0 else ())


def plant_no_batch_cap(mp) -> None:
    """A whole prompt joins the step, however many tokens the batch holds."""
    spans = LlamaCppModel._prompt_spans
    mp.setattr(LlamaCppModel, "_prompt_spans", lambda self, used: spans(self, 0))


def plant_one_slot_drafted(mp) -> None:
    """One generating slot speculates a step, the others decode (coopsched's one job at a time)."""
    rows = LlamaCppModel._generating_rows

    def first_only(self, generating):
        decodes, verifies = rows(self, generating[:1])
        return (*decodes, *((r.id, r.last_token) for r in generating[1:])), verifies
    mp.setattr(LlamaCppModel, "_generating_rows", first_only)


def test_a_request_waits_for_a_free_slot():
    check_waits_for_a_slot(simulate(three_at_once(), parallel=2)[0])


def test_prompts_join_the_generating_step_under_the_batch_size():
    check_prompt_joins_the_step(simulate(late_long_prompt(), batch_size=16)[0])


def test_without_continuous_batching_a_prompt_waits_for_an_empty_batch():
    times, _ = simulate(late_long_prompt(), batch_size=16, cont_batching=False)
    # r0 decodes alone to its end at 31; r1's prompt then takes three steps: 16, 16, 8 tokens
    assert times == {"r0": [6.0, 11.0, 16.0, 21.0, 26.0, 31.0], "r1": [57.0, 62.0]}


def test_every_generating_slot_drafts_in_one_call_and_verifies_in_one_batch():
    check_one_draft_call_for_every_slot(*simulate(two_drafting(), drafter=True, parallel=2))


@pytest.mark.parametrize("plant, requests, params, check", [
    pytest.param(plant_no_slots, three_at_once, dict(parallel=2), check_waits_for_a_slot, id="no-slots"),
    pytest.param(plant_prompt_alone, late_long_prompt, dict(batch_size=16), check_prompt_joins_the_step,
                 id="prompt-alone"),
    pytest.param(plant_no_batch_cap, late_long_prompt, dict(batch_size=16), check_prompt_joins_the_step,
                 id="no-batch-cap"),
])
def test_each_rule_check_fails_on_the_model_planted_wrong(plant, requests, params, check, monkeypatch):
    plant(monkeypatch)
    with pytest.raises(AssertionError):
        check(simulate(requests(), **params)[0])


def test_the_draft_check_fails_when_one_slot_speculates_a_step(monkeypatch):
    plant_one_slot_drafted(monkeypatch)
    with pytest.raises(AssertionError):
        check_one_draft_call_for_every_slot(*simulate(two_drafting(), drafter=True, parallel=2))


@pytest.mark.parametrize("max_tokens, n_min, drafts, steps", [
    pytest.param(6, 0, [(1, 3)], [1, 4, 1], id="cut-to-remaining-then-decode"),
    pytest.param(4, 0, [(1, 2)], [1, 3], id="cap-under-n-max"),
    pytest.param(4, 2, [(1, 2)], [1, 3], id="cap-at-n-min-drafts"),
    pytest.param(3, 2, [], [1, 1, 1], id="cap-under-n-min-decodes"),
])
def test_a_slot_drafts_at_most_its_remaining_tokens_minus_one(max_tokens, n_min, drafts, steps):
    times, calls = simulate([Request("r", prompt(8), max_tokens)], drafter=True, spec_draft_n_min=n_min)
    assert calls == drafts
    assert [times["r"].count(t) for t in dict.fromkeys(times["r"])] == steps


def test_the_cap_check_fails_when_the_draft_is_not_cut(monkeypatch):
    monkeypatch.setattr(LlamaCppModel, "_draft_cap", lambda self, request: 3)
    _, calls = simulate([Request("r", prompt(8), 6)], drafter=True)
    assert calls != [(1, 3)]


# a forward priced by its positions (1 ms each), so a row's own K shows in the step's length
BY_WIDTH = replace(COST, decode_ms=[[1, 1.0], [16, 16.0]], verify_ms=[[1, 1.0], [16, 16.0]])


def near_its_end() -> list[Request]:
    return [Request("long", prompt(8), 9), Request("short", prompt(8, 3), 4)]


def check_each_slot_verifies_its_own_cap(times, drafts) -> None:
    # both prompts (2 + 0.5 x 16); "short" has 3 tokens left, so 2 drafts and 3 positions beside
    # "long"'s 3 drafts and 4: one draft call at 3 (3 ms) and one verify of 7 positions (7 ms), then
    # "long" alone: 3 + 4
    assert drafts == [(2, 3), (1, 3)]
    assert times["short"] == [10.0, 20.0, 20.0, 20.0]
    assert times["long"] == [10.0] + [20.0] * 4 + [27.0] * 4


def test_each_slot_verifies_its_own_cap_plus_one_positions():
    """llama-server drafts min(n_max, remaining - 1) for each slot (server_slot::get_n_draft_max, and
    draft-simple stops each slot's draft at its own n_max): a slot near its budget's end adds fewer
    positions to the verify batch."""
    check_each_slot_verifies_its_own_cap(*simulate(near_its_end(), drafter=True, parallel=2, cost=BY_WIDTH))


def test_the_own_cap_check_fails_when_every_row_verifies_the_largest_k(monkeypatch):
    rows = LlamaCppModel._generating_rows

    def largest_k(self, generating):
        decodes, verifies = rows(self, generating)
        k = max((v.k for v in verifies), default=0)
        return decodes, tuple(v._replace(k=k) for v in verifies)
    monkeypatch.setattr(LlamaCppModel, "_generating_rows", largest_k)
    with pytest.raises(AssertionError):
        check_each_slot_verifies_its_own_cap(*simulate(near_its_end(), drafter=True, parallel=2, cost=BY_WIDTH))


def test_a_slot_at_its_last_token_decodes_in_the_verify_forward():
    # "short" (2 tokens) decodes its last one in the forward that verifies "long"'s 4 positions:
    # one fused forward of 5 positions after a 3-token draft call
    times, calls = simulate([Request("long", prompt(8), 9), Request("short", prompt(8, 3), 2)], drafter=True,
                            parallel=2, cost=BY_WIDTH)
    assert calls[0] == (1, 3) and times["short"] == [10.0, 18.0] and times["long"][1:5] == [18.0] * 4


def test_every_param_names_the_flag_it_mirrors():
    assert {p.name for p in LlamaCppModel.PARAMS} == {"parallel", "batch_size", "cont_batching", "draft_model",
                                                      "spec_draft_n_max", "spec_draft_n_min", "frontend_ms",
                                                      "frontend_stall_ms", "wake_ms", "idle_wake_ms"}
    assert all((p.flag.startswith("--") or "no flag" in p.flag) and p.meaning for p in LlamaCppModel.PARAMS)


@pytest.mark.parametrize("drafter, draft_model, speculated", [
    pytest.param(True, None, True, id="config-drafter"),
    pytest.param(True, False, False, id="server-without-draft-model"),
    pytest.param(False, True, True, id="server-with-draft-model"),
])
def test_the_server_setting_wins_over_the_config_drafter(drafter, draft_model, speculated):
    _, calls = simulate(two_drafting(), drafter=drafter, draft_model=draft_model)
    assert bool(calls) is speculated


@pytest.mark.parametrize("params, match", [
    pytest.param(dict(parallel=0), r"parallel=0: want a whole number >= 1", id="no-slots"),
    pytest.param(dict(batch_size=2.5), r"batch_size=2.5: want a whole number >= 1", id="fraction"),
    pytest.param(dict(cont_batching="no"), r"cont_batching='no': want true or false", id="text"),
    pytest.param(dict(draft_model=1), r"draft_model=1: want true, false or null", id="draft-number"),
    pytest.param(dict(frontend_ms=-1.0), r"frontend_ms=-1.0: a llama.cpp twin wants", id="negative-frontend"),
    pytest.param(dict(n_parallel=4), r"'n_parallel' unknown for a llama.cpp server; accepted: parallel", id="name"),
])
def test_a_bad_param_is_named(params, match):
    with pytest.raises(ValueError, match=match):
        make_scheduler("llama.cpp", SchedulerConfig(), params)


# -- a step's price grows with what its rows have cached (each position's attention reads it) --------
CONTEXT = replace(COST, context_per_token_ms=0.01)


def check_context_priced(times) -> None:
    # "short": prefill 2 + 0.5 x 8, then decode steps of 5 + 0.01 x its cache (8, 9, 10 tokens);
    # "long" alone at 22: prefill 2 + 0.5 x 40, one step at a cache of 40
    assert times["short"] == pytest.approx([6.0, 11.08, 16.17, 21.27])
    assert times["long"] == pytest.approx([44.0, 49.4])


def short_then_long() -> list[Request]:
    return [Request("short", prompt(8), 4), Request("long", prompt(40, 3), 2, arrival_ms=22.0)]


def test_a_decode_step_costs_more_the_more_its_row_has_cached():
    check_context_priced(simulate(short_then_long(), cost=CONTEXT, parallel=1)[0])


def test_the_context_check_fails_on_a_mock_that_prices_by_width_alone(monkeypatch):
    monkeypatch.setattr(MockBackend, "_context", lambda self, rows, positions: 0.0)
    with pytest.raises(AssertionError):
        check_context_priced(simulate(short_then_long(), cost=CONTEXT, parallel=1)[0])


def test_a_verify_row_pays_its_cache_once_per_position():
    # prefill 6; one draft call (3 ms) and a verify of 4 positions over a cache of 8: 5 + 0.01 x 32
    times, calls = simulate([Request("r", prompt(8), 5)], drafter=True, cost=CONTEXT)
    assert calls == [(1, 3)] and times["r"] == pytest.approx([6.0] + [14.32] * 4)


def test_without_the_term_a_profile_prices_as_before():
    assert simulate(short_then_long(), parallel=1)[0] == {"short": [6.0, 11.0, 16.0, 21.0], "long": [44.0, 49.0]}


def test_the_frontend_delays_each_arrival_in_an_open_loop_run():
    """The twin submits each request frontend_ms after the client sent it (HTTP, tokenizing), and
    counts its TTFT from the send: the frontend is not charged inside a step the prompt joins."""
    from harness.run import runner
    from harness.run.scenario import RequestSpec, Scenario

    cost = CostModel(prefill_fixed_ms=2.0, prefill_per_token_ms=0.5, decode_ms=[[1, 4.0]])
    scenario = Scenario("lone", requests=(RequestSpec("a", 0.0, 4, max_tokens=2), RequestSpec("b", 3.0, 4,
                                                                                           max_tokens=2)))
    ttft = {}
    for frontend in (0.0, 5.0):
        run = runner.execute(runner.priced(scenario, runner.Profile(cost, "llama.cpp", {"frontend_ms": frontend})),
                             SchedulerConfig(has_drafter=False))
        ttft[frontend] = [run.token_times[r.id][0] - r.arrival_ms for r in run.requests]
    # a: prompt 4 ms; b, seen before a's first token, joins a's decode: one step of 4 + 4 ms
    assert ttft[0.0] == [4.0, 4.0 + 8.0 - 3.0]
    assert ttft[5.0] == [5.0 + 4.0, 9.0 + 8.0 - 3.0]


def twin_token_times(scenario, cost: CostModel, params: dict) -> dict[str, list[float]]:
    """The scenario on the llama.cpp twin with these server_params, through the runner (its
    shared-core and wake charges): each request's token times."""
    from harness.run import runner

    profile = runner.Profile(cost, "llama.cpp", params)
    return runner.execute(runner.priced(scenario, profile), SchedulerConfig(has_drafter=False)).token_times


def test_an_arrivals_http_work_stretches_the_step_it_overlaps():
    """llama-server pinned to one core: an arrival's HTTP thread (parse, tokenize) takes the core from
    the slot loop for frontend_stall_ms from its send, so the step it overlaps ends that much later
    (harness/run/shared_core.py, the seam vLLM's twin uses too)."""
    from harness.run.scenario import RequestSpec, Scenario

    cost = CostModel(prefill_fixed_ms=0.0, prefill_per_token_ms=0.5, decode_ms=[[1, 4.0], [2, 4.0]])
    scenario = Scenario("stall", requests=(RequestSpec("a", 0.0, 4, max_tokens=6), RequestSpec("b", 9.0, 4,
                                                                                           max_tokens=1)))
    times = {stall: twin_token_times(scenario, cost, {"frontend_ms": 3.0, "frontend_stall_ms": stall})
             for stall in (0.0, 3.0)}
    # a seen at 3: prompt 3-5, steps 5-9, 9-13; b sent at 9 holds the core 9-12, so that step ends at
    # 16; b (seen at 12) joins the next step: its prompt 2 ms and a's decode 4 ms
    assert times[0.0] == {"a": [5.0, 9.0, 13.0, 19.0, 23.0, 27.0], "b": [19.0]}
    assert times[3.0] == {"a": [5.0, 9.0, 16.0, 22.0, 26.0, 30.0], "b": [22.0]}


def test_each_token_wakes_the_requests_waiting_beyond_the_step():
    """llama-server's result queue wakes every waiting HTTP thread for each token it sends: a token
    costs wake_ms for each request in the server beyond the step's rows, charged after the step."""
    from harness.run.scenario import RequestSpec, Scenario

    cost = CostModel(prefill_fixed_ms=0.0, prefill_per_token_ms=0.5, decode_ms=[[1, 4.0]])
    scenario = Scenario("wake", requests=(RequestSpec("a", 0.0, 4, max_tokens=3),
                                          RequestSpec("b", 0.0, 4, max_tokens=1)))
    times = {wake: twin_token_times(scenario, cost, {"parallel": 1, "wake_ms": wake}) for wake in (0.0, 1.0)}
    # one slot: a's prompt 0-2, steps 2-6, 6-10, then b's prompt 10-12; with b waiting, each of a's
    # three tokens wakes b's thread for 1 ms after its step (its last too: b still waits then)
    assert times[0.0] == {"a": [2.0, 6.0, 10.0], "b": [12.0]}
    assert times[1.0] == {"a": [2.0, 7.0, 12.0], "b": [15.0]}
