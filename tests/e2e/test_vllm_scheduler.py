"""The `vllm` twin against vLLM's own v1 `Scheduler`: the same step sequence on the same workloads.

Both run on the mock model in virtual time (harness/sim/vllm_scheduler.py): vLLM's scheduler plans
each step, the mock runs it, its tokens go back as the model runner's output. Rows, tokens per row
and the step start times must be equal, without and with ngram speculation (every row proposing,
or a share of row-steps, as ngram's lookup matches only where text repeats). One difference is
known and listed: a row the budget cannot give 1 + K (vLLM trims its drafts; the twin decodes it).
`tox -e interop` installs vLLM; elsewhere these tests are skipped.
"""

from __future__ import annotations

import random

import pytest

from coopsched.core import Request, SamplingParams
from harness.sim import vllm_scheduler as vs
from mocks import CostModel

pytestmark = pytest.mark.interop

COST = CostModel(prefill_fixed_ms=3.0, prefill_per_token_ms=0.05, draft_prefill_per_token_ms=0.0,
                 decode_ms=[[1, 4.0], [8, 9.0]], draft_per_token_ms=0.0, verify_ms=[[1, 4.0], [64, 20.0]])


def workload(n: int = 14, seed: int = 3) -> list[Request]:
    """Open-loop arrivals, short and long prompts (long ones chunk under a 64-token budget)."""
    rng = random.Random(seed)
    at, out = 0.0, []
    for i in range(n):
        at += rng.expovariate(1 / 12.0)
        prompt = tuple(rng.randrange(32, 127) for _ in range(rng.choice((6, 20, 90, 170))))
        out.append(Request(f"q{i}", prompt, rng.randrange(6, 40), SamplingParams(ignore_eos=True),
                           arrival_ms=round(at, 3)))
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    pytest.importorskip("vllm", reason="vLLM is not installed: run `tox -e interop`")
    return tmp_path_factory.mktemp("vllm-scheduler")


def both(setup: vs.Setup, workdir) -> tuple[list[vs.Step], list[vs.Step]]:
    return vs.twin_steps(setup, workload()), vs.real_steps(setup, workload(), workdir)


@pytest.mark.parametrize("setup", [
    pytest.param(vs.Setup(max_num_seqs=4, max_num_batched_tokens=64, cost=COST), id="no-spec"),
    pytest.param(vs.Setup(max_num_seqs=4, max_num_batched_tokens=64, num_speculative_tokens=3, cost=COST,
                          accept_prob=0.6), id="ngram-k3"),
    pytest.param(vs.Setup(max_num_seqs=3, max_num_batched_tokens=256, num_speculative_tokens=5, cost=COST,
                          accept_prob=0.8), id="ngram-k5-long-budget"),
    pytest.param(vs.Setup(max_num_seqs=4, max_num_batched_tokens=64, num_speculative_tokens=4, cost=COST,
                          accept_prob=0.7, propose_share=0.4), id="ngram-k4-some-rows-propose"),
    # vLLM's ngram proposals held 3.29 tokens at K = 4 (2026-12-07): rows of 1 + 3 and 1 + 4 side by side
    pytest.param(vs.Setup(max_num_seqs=4, max_num_batched_tokens=64, num_speculative_tokens=4, cost=COST,
                          accept_prob=0.7, propose_share=0.4, draft_tokens=3.29), id="ngram-k4-short-proposals"),
])
def test_the_twin_schedules_every_step_as_vllm_does(setup, workdir):
    twin, real = both(setup, workdir)
    assert len(real) > 30 and any(len(s.tokens) > 2 for s in real)  # the workload exercises batching
    assert any(n > 1 and n != setup.num_speculative_tokens + 1 for s in real for n in s.tokens.values())  # chunks
    if 0 < setup.propose_share < 1:  # rows with and without proposals side by side in one step
        assert any({1, setup.num_speculative_tokens + 1} <= set(s.tokens.values()) for s in real)
    if setup.draft_tokens is not None:  # proposals of both lengths in one step
        assert any({4, 5} <= set(s.tokens.values()) for s in real)
    assert vs.differences(twin, real) == []


def test_a_budget_below_1_plus_k_per_row_is_the_listed_difference(workdir):
    setup = vs.Setup(max_num_seqs=4, max_num_batched_tokens=10, num_speculative_tokens=3, cost=COST, accept_prob=0.6)
    twin, real = both(setup, workdir)
    found = vs.differences(twin, real)
    assert found, "a 10-token budget over four rows of 1 + 3 must trim some row's drafts"
    first = next(i for i, (a, b) in enumerate(zip(twin, real)) if a.key() != b.key())
    ours, theirs = twin[first].tokens, real[first].tokens
    # the first difference: a row vLLM gave 1 + fewer than K drafts, and the twin one decode token
    trimmed = [seq_id for seq_id, n in theirs.items() if 1 < n < 4 and ours.get(seq_id) == 1]
    assert trimmed and 4 in ours.values(), found[0]
    assert vs.differences(twin[:first], real[:first]) == []


def test_a_planted_budget_bug_in_the_twin_is_caught(workdir, monkeypatch):
    from coopsched.twins.vllm import VllmModel

    init = VllmModel.__init__

    def doubled(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.token_budget *= 2  # the planted bug: twice the budget vLLM gives a step
    monkeypatch.setattr(VllmModel, "__init__", doubled)
    setup = vs.Setup(max_num_seqs=4, max_num_batched_tokens=64, cost=COST)
    assert vs.differences(*both(setup, workdir))
