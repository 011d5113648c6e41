"""The `vllm` twin's step rule, step by step in virtual time: the token budget, the running cap,
running rows before waiting ones, FIFO admission, chunked prefill and K proposals per row.

Each rule has a planted regression (the rule removed) that the same table must catch.
"""

from __future__ import annotations

import pytest
from factories import make_backend
from plants import caught

from coopsched.clock import ManualClock
from coopsched.core import Request, SamplingParams, SchedulerConfig
from coopsched.core.types import ActionKind, TickKind
from coopsched.engine import Engine
from coopsched.twins import make_scheduler
from coopsched.twins.vllm import Step, VllmModel
from harness.sim.vllm_scheduler import plan_tokens
from mocks import CostModel

FREE_RUN = SamplingParams(ignore_eos=True)  # every request runs to max_tokens


def req(seq_id: str, prompt_len: int, max_tokens: int = 3, at: float = 0.0) -> Request:
    return Request(seq_id, tuple(65 + i % 26 for i in range(prompt_len)), max_tokens, FREE_RUN, arrival_ms=at)


def run(requests, *, k: int = 0, accept: float = 0.7, cost: CostModel | None = None, **params):
    """(steps as {seq_id: tokens}, the plans, the engine's result) of the requests on the twin."""
    config = SchedulerConfig(max_batch_size=64, num_kv_slots=64, has_drafter=k > 0, block_size=max(k + 1, 2))
    model = make_scheduler("vllm", config, {"num_speculative_tokens": k, **params})
    backend = make_backend(ManualClock(), cost=cost or CostModel(), accept_prob=accept)
    plans = []
    engine = Engine(model, backend, backend.clock,
                    on_tick=lambda c: plans.append(c.plan) if c.plan.action is not ActionKind.IDLE else None)
    result = engine.run(requests)
    return [plan_tokens(p) for p in plans], plans, result


# max_num_seqs=2, budget 8: r0 and r1's first 3 tokens fill step 1; r1's rest rides with r0's decode;
# r2 waits for a running place (r0 finishes in step 3), not for budget
CAPPED = [{"r0": 5, "r1": 3}, {"r0": 1, "r1": 3}, {"r0": 1, "r1": 1}, {"r1": 1, "r2": 3}, {"r2": 1}, {"r2": 1}]


def capped_requests():
    return [req("r0", 5), req("r1", 6), req("r2", 3)]


def test_budget_and_running_cap_shape_every_step():
    steps, plans, _ = run(capped_requests(), max_num_seqs=2, max_num_batched_tokens=8)
    assert steps == CAPPED
    assert [p.kind for p in plans] == [TickKind.CHUNK, TickKind.MIXED, TickKind.DECODE, TickKind.MIXED,
                                       TickKind.DECODE, TickKind.DECODE]
    assert all(sum(s.values()) <= 8 for s in steps)


def test_running_rows_are_served_before_waiting_ones():
    # budget 4: r0 decodes first (1), the late long prompt chunks in what is left (3), never 4
    steps, _, _ = run([req("r0", 2, max_tokens=4), req("r1", 8, at=0.5)], max_num_batched_tokens=4)
    assert steps[:4] == [{"r0": 2}, {"r0": 1, "r1": 3}, {"r0": 1, "r1": 3}, {"r0": 1, "r1": 2}]


def test_admission_is_fifo_and_stops_at_the_first_that_cannot_start():
    # chunked prefill off: r1 (12 tokens) cannot fit budget 10 beside r0, and r2 behind it waits too
    steps, _, _ = run([req("r0", 4), req("r1", 12), req("r2", 2)], max_num_batched_tokens=12,
                      enable_chunked_prefill=False)
    assert steps[0] == {"r0": 4}
    assert steps[1] == {"r0": 1}  # 11 left: still not 12 with r0's decode in the step
    chunked, _, _ = run([req("r0", 4), req("r1", 12), req("r2", 2)], max_num_batched_tokens=12)
    assert chunked[0] == {"r0": 4, "r1": 8}


def test_every_running_row_verifies_k_each_step():
    # K = 2: a row past its prompt schedules 1 + K; all drafts accepted, each step emits 3 tokens a row
    steps, plans, result = run([req("a", 4, max_tokens=7), req("b", 4, max_tokens=7)], k=2, accept=1.0)
    assert steps == [{"a": 4, "b": 4}, {"a": 3, "b": 3}, {"a": 3, "b": 3}]
    assert [p.kind for p in plans[1:]] == [TickKind.ROUND, TickKind.ROUND]
    assert {e.seq_id for e in result.events if e.finish_reason} == {"a", "b"}


def test_a_row_without_proposals_decodes_one_token():
    # ngram proposes only where its lookup matches: propose_share 0.3 of row-steps verify 1 + K, the
    # rest decode one; the same (request, tokens so far) always decides the same way
    def steps(share):
        return run([req(f"r{i}", 4, max_tokens=60) for i in range(4)], k=3, accept=0.0, propose_share=share)[0]

    widths = [n for step in steps(0.3)[1:] for n in step.values()]
    assert set(widths) == {1, 4}
    assert 0.2 < widths.count(4) / len(widths) < 0.4
    assert steps(0.3) == steps(0.3)
    assert {n for step in steps(0.0)[1:] for n in step.values()} == {1}
    with pytest.raises(ValueError, match=r"propose_share=1.5: .* within \[0, 1\]"):
        steps(1.5)


@pytest.mark.parametrize("share", [0.2, 0.379, 0.6])
def test_the_share_holds_along_the_counts_a_row_visits(share, monkeypatch):
    """A proposing row skips ahead by its accepted drafts, so a row's draws are taken at the token
    counts it visits, not at every count. With CRC-32 draws (linear: neighbouring counts' draws are
    related) a share of 0.379 proposed at 0.47 of the row-steps of the held-out workload."""
    import coopsched.twins.vllm as vllm

    drawn: list[bool] = []
    real = vllm.proposes
    monkeypatch.setattr(vllm, "proposes", lambda *a: drawn.append(real(*a)) or drawn[-1])
    run([req(f"w{i:04d}", 4, max_tokens=48, at=5.0 * i) for i in range(64)], k=4, accept=0.75, propose_share=share)
    assert len(drawn) > 1000 and sum(drawn) / len(drawn) == pytest.approx(share, abs=0.03)


def test_proposals_are_as_long_as_the_servers_on_average():
    # vLLM's ngram proposals held 3.29 tokens at K = 4: 29% of proposals draft 4, the rest 3
    def widths(mean):
        steps = run([req(f"r{i}", 4, max_tokens=80) for i in range(4)], k=4, accept=0.0, draft_tokens=mean)[0]
        return [n for step in steps[1:] for n in step.values() if n > 1]

    got = widths(3.29)
    assert set(got) == {4, 5} and sum(got) / len(got) - 1 == pytest.approx(3.29, abs=0.08)
    assert set(widths(None)) == {5} and set(widths(1.0)) == {2}  # null: K
    for bad in (0.5, 4.5, True):
        with pytest.raises(ValueError, match=rf"draft_tokens={bad!r}: .* within \[1, K=4\]"):
            widths(bad)


def test_speculation_shares_the_step_with_a_prompt_chunk():
    steps, plans, _ = run([req("a", 4, max_tokens=9), req("b", 20, at=1.0)], k=3, accept=0.0,
                          max_num_batched_tokens=12)
    assert steps[:3] == [{"a": 4}, {"a": 4, "b": 8}, {"a": 4, "b": 8}]
    assert plans[1].kind is TickKind.FUSED and plans[1].verifies[0].k == 4


def test_a_row_the_budget_cannot_give_1_plus_k_decodes_one_token():
    # vLLM would trim that row's drafts to what fits; one plan shares one K, so the twin decodes it
    steps, _, _ = run([req("a", 2), req("b", 2), req("c", 2)], k=2, accept=0.0, max_num_batched_tokens=8)
    assert steps[1] == {"a": 3, "b": 3, "c": 1}


def test_mixed_step_is_priced_as_one_chunk_and_one_decode_forward():
    cost = CostModel(prefill_fixed_ms=2.0, prefill_per_token_ms=0.5, decode_ms=[[1, 4.0], [8, 11.0]])
    _, _, result = run([req("r0", 5, max_tokens=2), req("r1", 6, max_tokens=2, at=1.0)], cost=cost,
                       max_num_batched_tokens=8)
    # step 1: r0's prompt (2 + 2.5); step 2: r0's decode and r1's 6 tokens (2 + 3 + 4)
    assert [(t.start_ms, t.end_ms) for t in result.ticks[:2]] == [(0.0, 4.5), (4.5, 13.5)]


# a vLLM profile: a prompt-only step runs a forward of its own (3 ms), a prompt beside decode or verify
# rows rides in theirs (shared_prefill_fixed_ms 0); 0.5 ms a prompt token
ONE_FORWARD = CostModel(prefill_fixed_ms=3.0, prefill_per_token_ms=0.5, shared_prefill_fixed_ms=0.0,
                        draft_prefill_per_token_ms=0.0, draft_per_token_ms=0.0,
                        decode_ms=[[1, 4.0], [8, 11.0]], verify_ms=[[1, 4.0], [8, 11.0]])


@pytest.mark.parametrize("requests, k, want", [
    # r0 alone: its 5 tokens and a forward (3 + 2.5); then r0's decode with r1's 6 tokens: one forward (4 + 3)
    pytest.param([req("r0", 5, max_tokens=2), req("r1", 6, max_tokens=2, at=1.0)], 0, [(0.0, 5.5), (5.5, 12.5)],
                 id="prompt-only-pays-a-forward-mixed-pays-one"),
    # two prompts alone in a step: one forward (3 + 0.5 x 11), then their decodes
    pytest.param([req("r0", 5, max_tokens=2), req("r1", 6, max_tokens=2)], 0, [(0.0, 8.5), (8.5, 13.5)],
                 id="prompts-alone-share-one-forward"),
    # K = 2: r0 verifies 3 positions (verify(3) = 6) while r1's 6 tokens ride in that forward (+3)
    pytest.param([req("r0", 4, max_tokens=6), req("r1", 6, max_tokens=2, at=1.0)], 2, [(0.0, 5.0), (5.0, 14.0)],
                 id="fused-with-verifies-pays-one"),
])
def test_a_prompt_only_step_costs_a_forward_and_a_mixed_step_one(requests, k, want):
    _, _, result = run(requests, k=k, accept=0.0, cost=ONE_FORWARD)
    assert [pytest.approx(t, abs=1e-9) for t in want] == [(t.start_ms, t.end_ms) for t in result.ticks[:2]]


def test_params_are_documented_with_the_flag_they_mirror():
    assert {p.name: p.flag for p in VllmModel.PARAMS} == {
        "max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
        "num_speculative_tokens": "--speculative-config num_speculative_tokens",
        "enable_chunked_prefill": "--enable-chunked-prefill", "frontend_ms": "(the API server process: no flag)",
        "frontend_stall_ms": "(the API server sharing the engine's core: no flag)",
        "frontend_busy_ms": "(the API server sharing the engine's core: no flag)",
        "propose_share": "(ngram: its prompt lookup's matches; no flag)",
        "draft_tokens": "(ngram: its proposals' length; no flag)"}
    with pytest.raises(ValueError, match="'max_num_seq' unknown"):
        make_scheduler("vllm", SchedulerConfig(), {"max_num_seq": 4})
    with pytest.raises(ValueError, match="max_num_seqs=0: a vllm twin wants an int >= 1"):
        make_scheduler("vllm", SchedulerConfig(), {"max_num_seqs": 0})


def test_rows_are_capped_by_max_num_seqs_not_by_kv_slots():
    # vLLM's cache is paged: a config with 2 KV slots still runs max_num_seqs = 4 rows at once
    model = make_scheduler("vllm", SchedulerConfig(num_kv_slots=2), {"max_num_seqs": 4})
    backend = make_backend(ManualClock())
    plans = []
    Engine(model, backend, backend.clock, on_tick=lambda c: plans.append(c.plan)).run(
        [req(f"r{i}", 3) for i in range(5)])
    assert plan_tokens(plans[0]) == {"r0": 3, "r1": 3, "r2": 3, "r3": 3}


def test_frontend_ms_delays_admission_and_counts_in_ttft():
    """An open-loop twin submits each request frontend_ms late; its TTFT is from the client's send."""
    from harness.run import runner
    from harness.run.scenario import RequestSpec, Scenario

    cost = CostModel(prefill_fixed_ms=2.0, prefill_per_token_ms=0.5, decode_ms=[[1, 4.0]])
    scenario = Scenario("lone", requests=(RequestSpec("a", 0.0, 4, max_tokens=2), RequestSpec("b", 3.0, 4,
                                                                                           max_tokens=2)))
    ttft = {}
    for frontend in (0.0, 5.0):
        priced = runner.priced(scenario, runner.Profile(cost, "vllm", {"frontend_ms": frontend}))
        run = runner.execute(priced, SchedulerConfig(has_drafter=False))
        ttft[frontend] = [run.token_times[r.id][0] - r.arrival_ms for r in run.requests]
    # a: seen at 0 (5), prefilled in 4 ms. b: seen at 3 (8), waits 1 ms for a's prefill to end, then
    # its prompt and a's decode in one mixed step (4 + 4 ms)
    assert ttft[0.0] == [4.0, 1.0 + 4.0 + 4.0]
    assert ttft[5.0] == [5.0 + 4.0, 5.0 + 1.0 + 4.0 + 4.0]
    assert [r.arrival_ms for r in run.requests] == [0.0, 3.0]  # restored: the client's send times


# -- planted regressions: each rule removed, the tables above must fail -------------------------
def _overriding(mp, **values):
    """The model built as configured, then `values` set over what it read from its params."""
    init = VllmModel.__init__

    def built(self, *args, **kwargs):
        init(self, *args, **kwargs)
        for name, value in values.items():
            setattr(self, name, value)
    mp.setattr(VllmModel, "__init__", built)


def _ignore_budget(mp):
    _overriding(mp, token_budget=10**9)


def _ignore_running_cap(mp):
    _overriding(mp, max_running=10**9)


def _waiting_first(mp):
    """Admission takes the budget before the running rows (prefill first)."""
    def prefill_first(self):
        step, running = Step(self.token_budget), list(self.running)
        self.admit_waiting(step)
        self.serve_running(running, step)
        return self._plan(step)
    mp.setattr(VllmModel, "plan_step", prefill_first)


def _every_row_proposes(mp):
    """The proposer's share ignored: every decoding row verifies K (the twin before ngram's share)."""
    mp.setattr("coopsched.twins.vllm.proposes", lambda *_: True)


def _one_spec_row(mp):
    """Speculation for one row a step (coopsched's B = 1 session), the others decode."""
    serve = VllmModel.serve_running

    def one_row(self, rows, step):
        serve(self, rows, step)
        step.decodes += [(v.seq_id, v.last_token) for v in step.verifies[1:]]
        del step.verifies[1:]
    mp.setattr(VllmModel, "serve_running", one_row)


PLANTS = {
    "budget-ignored": (_ignore_budget, test_budget_and_running_cap_shape_every_step),
    "running-cap-ignored": (_ignore_running_cap, test_budget_and_running_cap_shape_every_step),
    "waiting-before-running": (_waiting_first, test_running_rows_are_served_before_waiting_ones),
    "one-speculative-row": (_one_spec_row, test_every_running_row_verifies_k_each_step),
    "every-row-proposes": (_every_row_proposes, test_a_row_without_proposals_decodes_one_token),
}


test_planted_regression_is_caught = caught(PLANTS)
