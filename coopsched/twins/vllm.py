"""vLLM v1's step as a scheduler model: one forward per step under a token budget.

Transcribed (not copied) from vLLM's `vllm/v1/core/sched/scheduler.py` (`Scheduler.schedule`,
chunked prefill on): running requests first, in admission order, then waiting ones FIFO, each
taking what it needs from the step's token budget; with speculation a decoding row verifies K when
its proposer found any (ngram: when its prompt lookup matched), else it decodes one.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from coopsched.core.append import Vocab
from coopsched.core.config import SchedulerConfig
from coopsched.core.kv import KVSlotPool
from coopsched.core.plan import Decode, Plan, Prefill, Verify
from coopsched.core.request import Request
from coopsched.core.types import ActionKind, TickKind

from .base import Param, StepModel


class VllmModel(StepModel):
    kind = "vllm"
    PARAMS = (
        Param("max_num_seqs", 128, "--max-num-seqs",
              "requests running at once (prefilling or decoding); admission stops at this many "
              "(default: vLLM for CPU's, for its OpenAI server)"),
        Param("max_num_batched_tokens", 2048, "--max-num-batched-tokens",
              "tokens one step schedules over all its rows: 1 per decode, 1 + K per speculative "
              "decode, the rest to prompt chunks"),
        Param("num_speculative_tokens", 0, "--speculative-config num_speculative_tokens",
              "K proposals per running request each step (0: no speculation configured)"),
        Param("propose_share", 1.0, "(ngram: its prompt lookup's matches; no flag)",
              "share of decoding row-steps the proposer finds drafts for; the others decode one token "
              "(1: a draft model or MTP proposes every step; ngram only where the text repeats)"),
        Param("draft_tokens", None, "(ngram: its proposals' length; no flag)",
              "mean tokens a proposal holds, within [1, K] (vllm:spec_decode_num_draft_tokens_total over "
              "num_drafts_total): ngram proposes fewer than K where its match lies near the text's end. A "
              "proposing row-step drafts the whole number below or above it, so the mean holds (null: K)"),
        Param("enable_chunked_prefill", True, "--enable-chunked-prefill",
              "a prompt longer than the budget left is prefilled in chunks over several steps "
              "(off: it waits for a step with room for all of it)"),
        Param("frontend_ms", 0.0, "(the API server process: no flag)",
              "ms from a client's send to the engine's scheduler seeing the request (HTTP, tokenizing, "
              "IPC): an open-loop twin submits each request that much later and counts TTFT from its send"),
        Param("frontend_busy_ms", 0.0, "(the API server sharing the engine's core: no flag)",
              "ms more than frontend_ms for a request sent while the engine is in a step (the API server "
              "waits for the engine's core); one sent to an idle engine takes frontend_ms"),
        Param("frontend_stall_ms", 0.0, "(the API server sharing the engine's core: no flag)",
              "ms of the engine's core each arrival's frontend work takes from its send (the API server "
              "process on the same core): a forward it overlaps is stretched by it (0: a core of its own)"),
    )

    def __init__(self, config: SchedulerConfig, params: Mapping[str, object] | None = None, *,
                 keep_history: bool = True, vocab: Vocab | None = None) -> None:
        super().__init__(config, params, keep_history=keep_history, vocab=vocab)
        self.max_running = _count(self.params, "max_num_seqs", 1)
        # vLLM's KV cache is paged: max_num_seqs caps its rows, not a slot count (preemption: not modelled)
        self.kv = KVSlotPool(max(config.num_kv_slots, self.max_running), config.slot_tokens)
        self.token_budget = _count(self.params, "max_num_batched_tokens", 1)
        self.num_spec = _count(self.params, "num_speculative_tokens", 0)  # K: proposals a row a step
        self.chunked = bool(self.params["enable_chunked_prefill"])
        self.propose_share = _share(self.params["propose_share"])
        self.draft_tokens = _draft_tokens(self.params["draft_tokens"], self.num_spec)

    @property
    def speculates(self) -> bool:
        """vLLM speculates when its server is started with a speculative config, for every request."""
        return self.num_spec > 0

    def plan_step(self) -> Plan:
        step = Step(self.token_budget)
        self.serve_running(self.running, step)
        self.admit_waiting(step)
        return self._plan(step)

    def serve_running(self, rows: list[Request], step: Step) -> None:
        """Rows already running, in admission order, each taking what it needs from the budget: a
        prompt's next chunk, 1 + its proposal's length when it has one, else 1; the budget spent, later
        rows wait."""
        for request in rows:
            if step.budget <= 0:
                break
            if request.num_prefilled < len(request.prompt_token_ids):
                step.add_span(self.span(request, step.budget))
                continue
            width = 1 + self._drafts(request)
            if 1 < width <= step.budget:
                step.verifies.append(Verify(request.id, request.last_token, width))  # type: ignore[arg-type]
                step.budget -= width
            else:  # no proposal, or too little budget for it (vLLM trims the drafts; the twin decodes)
                step.decodes.append((request.id, request.last_token))  # type: ignore[arg-type]
                step.budget -= 1

    def _drafts(self, request: Request) -> int:
        """The drafts a decoding row's proposer finds this step: none, or a proposal's length."""
        produced = len(request.output_token_ids)
        key = f"{request.id}#{self.draw}" if self.draw else request.id  # draw 0: the differential test's keys
        if not self.num_spec or not proposes(key, produced, self.propose_share):
            return 0
        return draft_length(key, produced, self.draft_tokens)

    def admit_waiting(self, step: Step) -> list[Request]:
        """Waiting requests FIFO while the step has budget, a running place and a KV slot; the
        first that cannot start stops admission (no overtaking). Returns those admitted."""
        admitted: list[Request] = []
        while self.waiting and step.budget > 0 and len(self.running) < self.max_running and self.kv.num_free:
            request: Request = self.waiting[0]
            if not self.chunked and len(request.prompt_token_ids) > step.budget:
                break  # without chunking a prompt waits for a step with room for all of it
            self.admit(request)
            step.add_span(self.span(request, step.budget))
            admitted.append(request)
        return admitted

    def _plan(self, step: Step) -> Plan:
        """The step as one plan, its kind named by the work it holds."""
        spans, decodes, verifies = step.spans, step.decodes, step.verifies
        if not (spans or decodes or verifies):
            return self.idle_plan()
        ids = tuple([s.seq_id for s in spans] + [d[0] for d in decodes] + [v.seq_id for v in verifies])
        if verifies:
            action, kind = ((ActionKind.FUSED, TickKind.FUSED) if decodes or spans
                            else (ActionKind.SPEC_ROUND, TickKind.ROUND))
        elif decodes:
            action, kind = (ActionKind.MIXED, TickKind.MIXED) if spans else (ActionKind.DECODE, TickKind.DECODE)
        else:
            whole = all(s.start == 0 and s.is_last for s in spans)
            action, kind = ActionKind.PREFILL, TickKind.ADMIT if whole else TickKind.CHUNK
        return Plan(action, kind, self.state(), ids, tuple(spans), tuple(decodes), tuple(verifies),
                    prefill_tokens=tuple([s.stop - s.start for s in spans]) if kind is TickKind.CHUNK else ())


@dataclass
class Step:
    """One step's rows as they are planned, and the token budget still unspent."""
    budget: int
    spans: list[Prefill] = field(default_factory=list)
    decodes: list[Decode] = field(default_factory=list)
    verifies: list[Verify] = field(default_factory=list)

    def add_span(self, span: Prefill) -> None:
        self.spans.append(span)
        self.budget -= span.stop - span.start


def proposes(seq_id: str, produced: int, share: float) -> bool:
    """Whether a row's proposer finds drafts at this step: `share` of its row-steps, picked by a hash
    of the request and its tokens so far (deterministic, spread over the run, and the same in the
    twin and in the driver of vLLM's own scheduler)."""
    return share >= 1.0 or _uniform(f"{seq_id}:{produced}") < share


def draft_length(seq_id: str, produced: int, mean: float) -> int:
    """A proposal's length at this step: the whole number above `mean` for mean's fraction of
    proposals, else the one below, picked by a second hash of the request and its tokens so far."""
    whole = math.floor(mean)
    return whole + int(_uniform(f"{seq_id}:{produced}:length") < mean - whole)


def _uniform(key: str) -> float:
    """A draw in [0, 1) fixed by `key`. A cryptographic hash, not CRC-32: CRC is linear, so the
    draws of one row's neighbouring token counts were related, and along the counts a row visits
    (a proposing step skips ahead by its accepted drafts) a share of 0.379 proposed at 0.47 of the
    row-steps: the twin drafted 21-29% more than vLLM."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2**64


def _draft_tokens(value: object, k: int) -> float:
    if value is None:
        return float(k)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1.0 <= value <= max(k, 1):
        raise ValueError(f"server_params draft_tokens={value!r}: a vllm twin wants a mean within [1, K={k}], "
                         "or null (K)")
    return float(value)


def _share(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"server_params propose_share={value!r}: a vllm twin wants a share within [0, 1]")
    return float(value)


def _count(params: Mapping[str, object], name: str, least: int) -> int:
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"server_params {name}={value!r}: a vllm twin wants an int >= {least}")
    return value
