"""vLLM's own v1 `Scheduler` on the virtual clock, beside the `vllm` twin, for a differential check.

Both run the same requests on the same mock model and costs: vLLM's scheduler plans each step
(`schedule()`), coopsched's executor runs it as a plan on the mock (so a step costs what the twin's
would), and the mock's tokens go back as a `ModelRunnerOutput` (`update_from_output`), with draft
ids for the rows past their prompt that the twin's proposer rule picks, as many as its rule for a
proposal's length says (`update_draft_token_ids`; every such row, K each, at a share of 1 and no
draft_tokens), as vLLM's scheduler unit tests drive it.
Needs vLLM (the `interop` env); `vllm` is imported only here.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from coopsched.clock import ManualClock
from coopsched.core import Request, SchedulerConfig
from coopsched.core.plan import Plan, Prefill, Verify
from coopsched.core.spec import accept_walk
from coopsched.core.types import ActionKind, TickKind, TickState
from coopsched.engine import Engine
from coopsched.executor import Executor
from coopsched.twins import make_scheduler
from coopsched.twins.vllm import draft_length, proposes
from mocks import CostModel, MockBackend, MockDrafter, MockTarget


@dataclass(frozen=True)
class Step:
    """One step: when it began and the tokens it scheduled per request."""
    start_ms: float
    tokens: Mapping[str, int]

    def key(self) -> tuple:
        return round(self.start_ms, 6), tuple(sorted(self.tokens.items()))


@dataclass(frozen=True)
class Setup:
    """The server's scheduler settings and the mock it runs on."""
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    num_speculative_tokens: int = 0      # 0: no speculation
    propose_share: float = 1.0           # row-steps the proposer finds drafts for (ngram: where text repeats)
    draft_tokens: float | None = None    # a proposal's mean length (None: K)
    cost: CostModel = field(default_factory=CostModel)
    accept_prob: float = 0.7
    max_model_len: int = 4096

    def backend(self, clock: ManualClock) -> MockBackend:
        return MockBackend(clock, self.cost, MockTarget(), MockDrafter(self.accept_prob))

    def config(self) -> SchedulerConfig:
        k = self.num_speculative_tokens
        return SchedulerConfig(max_batch_size=self.max_num_seqs, num_kv_slots=max(self.max_num_seqs, 1),
                               slot_tokens=self.max_model_len, has_drafter=k > 0, block_size=max(k + 1, 2))

    def params(self) -> dict:
        return {"max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
                "num_speculative_tokens": self.num_speculative_tokens, "propose_share": self.propose_share,
                "draft_tokens": self.draft_tokens}


def plan_tokens(plan: Plan) -> dict[str, int]:
    """What a plan schedules per row: a span's prompt tokens, 1 per decode, K + 1 per verify."""
    out = {s.seq_id: s.stop - s.start for s in plan.prefills}
    out.update({seq_id: 1 for seq_id, _ in plan.decodes})
    out.update({v.seq_id: v.k for v in plan.verifies})
    return out


def twin_steps(setup: Setup, requests: Sequence[Request]) -> list[Step]:
    """The `vllm` model's steps on the engine, in virtual time."""
    clock = ManualClock()
    steps: list[Step] = []
    model = make_scheduler("vllm", setup.config(), setup.params())

    def on_tick(committed) -> None:
        if committed.plan.action is not ActionKind.IDLE:
            steps.append(Step(committed.record.start_ms, plan_tokens(committed.plan)))
    Engine(model, setup.backend(clock), clock, on_tick=on_tick).run(list(requests))
    return steps


def model_dir(out: Path) -> Path:
    """A config-only llama for vLLM's ModelConfig: the scheduler reads the config, never weights."""
    out.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16,
              "num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 8192,
              "hidden_act": "silu", "rms_norm_eps": 1e-5, "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return out


class RealScheduler:
    """vLLM's `Scheduler` with the setup's limits, fed the requests at their arrival times."""

    def __init__(self, setup: Setup, workdir: Path) -> None:
        with warnings.catch_warnings():  # torch and vLLM warn of their own deprecations on import
            warnings.simplefilter("ignore")
            self._build(setup, workdir)
        self.setup = setup
        self.ours: dict[str, Request] = {}
        self.prefilled: dict[str, int] = {}     # prompt tokens the mock holds per request
        self.last: dict[str, int] = {}          # the last sampled token, not yet fed
        self.produced: dict[str, int] = {}
        self.proposed: dict[str, int] = {}      # the draft ids last given a row

    def _build(self, setup: Setup, workdir: Path) -> None:
        import torch
        from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        block_size, num_blocks = 16, 100_000  # room for every request: the twin has no preemption
        k = setup.num_speculative_tokens
        scheduler = SchedulerConfig(max_num_seqs=setup.max_num_seqs,
                                    max_num_batched_tokens=setup.max_num_batched_tokens,
                                    max_model_len=setup.max_model_len, enable_chunked_prefill=True,
                                    is_encoder_decoder=False)
        model = ModelConfig(model=str(model_dir(workdir)), skip_tokenizer_init=True, dtype="float32", seed=0,
                            max_model_len=setup.max_model_len)
        cache = CacheConfig(block_size=block_size, enable_prefix_caching=False)
        spec = SpeculativeConfig(method="ngram", num_speculative_tokens=k) if k else None
        config = VllmConfig(scheduler_config=scheduler, model_config=model, cache_config=cache,
                            speculative_config=spec)
        layer = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
        kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer"], layer)])
        cache.num_gpu_blocks = num_blocks
        self.scheduler = Scheduler(vllm_config=config, kv_cache_config=kv, log_stats=False,
                                   structured_output_manager=StructuredOutputManager(config), block_size=block_size)
        self.k = k

    def add(self, request: Request) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request as VllmRequest

        params = SamplingParams(max_tokens=request.max_tokens, ignore_eos=True, temperature=0.0)
        self.scheduler.add_request(VllmRequest(request.id, list(request.prompt_token_ids), params,
                                               pooling_params=None))
        self.ours[request.id] = request
        self.prefilled[request.id] = self.produced[request.id] = 0

    def plan(self, output) -> Plan:
        """vLLM's scheduled tokens as coopsched's plan: prompt spans, verifies of 1 + the drafts it was
        given, decodes. A row whose drafts the budget trimmed runs as a decode, as the twin's does."""
        spans, decodes, verifies = [], [], []
        for seq_id, num_tokens in output.num_scheduled_tokens.items():
            request, held = self.ours[seq_id], self.prefilled[seq_id]
            if held < len(request.prompt_token_ids):
                spans.append(Prefill(seq_id, request.prompt_token_ids, held, held + num_tokens, request.sampling,
                                     self.k > 0))
                self.prefilled[seq_id] = held + num_tokens
            elif len(output.scheduled_spec_decode_tokens.get(seq_id, ())) == self.proposed.get(seq_id, 0) > 0:
                verifies.append(Verify(seq_id, self.last[seq_id], self.proposed[seq_id] + 1))
            else:
                decodes.append((seq_id, self.last[seq_id]))
        return Plan(ActionKind.FUSED, TickKind.FUSED, TickState(), (), tuple(spans), tuple(decodes), tuple(verifies))

    def sampled(self, plan: Plan, result, backend: MockBackend) -> dict[str, list[int]]:
        """What the model runner would return per row (nothing for a chunk that leaves the prompt
        unfinished), with the mock's caches rewound past rejected drafts and freed once done."""
        out: dict[str, list[int]] = {}
        for row, first in zip(plan.prefills, result.firsts):
            out[row.seq_id] = [] if first is None else [first]
        for (seq_id, _), token in zip(plan.decodes, result.tokens):
            out[seq_id] = [token]
        for v, drafts, targets in zip(plan.verifies, result.drafts, result.targets):
            emitted, accepted = accept_walk(drafts, targets, len(targets))
            out[v.seq_id] = emitted
            if self.produced[v.seq_id] + len(emitted) < self.ours[v.seq_id].max_tokens:
                backend.rewind(v.seq_id, len(drafts) - accepted)
        for seq_id, tokens in out.items():
            if tokens:
                self.last[seq_id] = tokens[-1]
                self.produced[seq_id] += len(tokens)
                if self.produced[seq_id] >= self.ours[seq_id].max_tokens:
                    backend.release(seq_id)
        return out

    def step(self, executor: Executor, backend: MockBackend) -> dict[str, int]:
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

        output = self.scheduler.schedule()
        plan = self.plan(output)
        result = executor.run(plan)
        if result.error is not None:
            raise RuntimeError(f"the mock failed a step vLLM planned: {result.error}")
        sampled = self.sampled(plan, result, backend)
        ids = list(output.num_scheduled_tokens)
        self.scheduler.update_from_output(output, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={seq_id: i for i, seq_id in enumerate(ids)},
            sampled_token_ids=[sampled[seq_id] for seq_id in ids], logprobs=None, prompt_logprobs_dict={},
            pooler_output=[]))
        if self.k:  # rows past their prompt propose where the rule says (the values never matter)
            share = self.setup.propose_share
            mean = self.k if self.setup.draft_tokens is None else self.setup.draft_tokens
            ready = [seq_id for seq_id in ids if seq_id in self.scheduler.requests
                     and self.prefilled[seq_id] == len(self.ours[seq_id].prompt_token_ids)
                     and proposes(seq_id, self.produced[seq_id], share)]
            self.proposed = {seq_id: draft_length(seq_id, self.produced[seq_id], mean) for seq_id in ready}
            self.scheduler.update_draft_token_ids(DraftTokenIds(ready, [[0] * self.proposed[s] for s in ready]))
        return dict(output.num_scheduled_tokens)


def real_steps(setup: Setup, requests: Sequence[Request], workdir: Path) -> list[Step]:
    """vLLM's scheduler's steps over the requests, run on the mock in virtual time as the twin is."""
    clock = ManualClock()
    backend = setup.backend(clock)
    executor, real = Executor(backend), RealScheduler(setup, workdir)
    pending = sorted(requests, key=lambda r: r.arrival_ms)
    steps: list[Step] = []
    while pending or real.scheduler.get_num_unfinished_requests():
        while pending and pending[0].arrival_ms <= clock.now():
            real.add(pending.pop(0))
        if not real.scheduler.get_num_unfinished_requests():
            clock.advance_to(pending[0].arrival_ms)
            continue
        start = clock.now()
        tokens = real.step(executor, backend)
        if not tokens:
            raise RuntimeError(f"vLLM's scheduler planned an empty step with live requests at {start} ms")
        steps.append(Step(start, tokens))
    return steps


def differences(twin: Sequence[Step], real: Sequence[Step]) -> list[str]:
    """Each step where the two differ, said in one line (empty: the same step sequence)."""
    out = [f"step {i}: twin {a.tokens} at {a.start_ms:.3f} ms, vLLM {b.tokens} at {b.start_ms:.3f} ms"
           for i, (a, b) in enumerate(zip(twin, real)) if a.key() != b.key()]
    if len(twin) != len(real):
        out.append(f"the twin ran {len(twin)} steps, vLLM's scheduler {len(real)}")
    return out
