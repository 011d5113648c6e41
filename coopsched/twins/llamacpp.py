"""llama.cpp's `llama-server` as a step model: `--parallel` slots, continuous batching, prompts in
the generating slots' batch under `--batch-size`, and with a draft model one draft call for every
generating slot and one verify batch (the rule of `update_slots` in llama.cpp's
tools/server/server-context.cpp, in coopsched's terms; see docs/twins.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from coopsched.core.config import SchedulerConfig
from coopsched.core.plan import Decode, Plan, Prefill, Verify
from coopsched.core.request import Request
from coopsched.core.types import ActionKind, TickKind

from .base import Param, StepModel, is_prefilled


class LlamaCppModel(StepModel):
    """One `update_slots` pass per step. The server launches waiting tasks into free slots before
    each pass (first come, first served); the pass batches every generating slot's next token (or,
    with a draft model, its last token and its drafts), then the prompts of slots still processing
    them, in slot order, while the batch holds fewer than `batch_size` tokens."""

    kind = "llama.cpp"
    PARAMS = (
        Param("parallel", 4, "--parallel",
              "server slots (/props total_slots): requests served at once; a request waits for a free slot"),
        Param("batch_size", 2048, "--batch-size",
              "logical batch n_batch: prompt tokens join a step while its batch holds fewer tokens"),
        Param("cont_batching", True, "--cont-batching",
              "prompts join the generating slots' step; off: a prompt is processed only in a step of its own"),
        Param("draft_model", None, "--model-draft",
              "a draft model speculates every generating slot (/slots `speculative`); null: as the config's drafter"),
        Param("spec_draft_n_max", 3, "--spec-draft-n-max",
              "tokens drafted per generating slot and step (cut to the request's remaining tokens - 1)"),
        Param("spec_draft_n_min", 0, "--spec-draft-n-min",
              "a slot whose cap is under this many drafts decodes one token instead"),
        Param("frontend_ms", 0.0, "(the HTTP threads: no flag)",
              "ms from a client's send to the slot loop seeing the request (HTTP, tokenizing): an open-loop "
              "twin submits each request that much later and counts TTFT from its send"),
        Param("frontend_stall_ms", 0.0, "(the HTTP threads sharing the slot loop's core: no flag)",
              "ms of the slot loop's core each arrival's HTTP work takes from its send (a server pinned to "
              "one core): a step it overlaps is stretched by it (0: the HTTP threads have a core of their own)"),
        Param("wake_ms", 0.0, "(the result queue's notify_all: no flag)",
              "ms of the slot loop's core each streamed token takes waking the HTTP thread of every other "
              "request in the server (all wait on one condition variable): charged after a step, for its "
              "tokens x the requests beyond its rows (waiting for a slot, or still prompting)"),
        Param("idle_wake_ms", [], "(the machine: no flag)",
              "[idle ms, extra ms] pairs: how much later than frontend_ms a request reaches the slot loop "
              "when the server had done no step for that long before its send (a server gone cold); "
              "0 at no idle, linear between the points, the last beyond them"),
    )

    def __init__(self, config: SchedulerConfig, params: Mapping[str, object] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(config, params, **kwargs)
        self.parallel = _whole(self.params, "parallel", 1)
        self.batch_size = _whole(self.params, "batch_size", 1)
        self.n_max = _whole(self.params, "spec_draft_n_max", 0)
        self.n_min = _whole(self.params, "spec_draft_n_min", 0)
        self.cont_batching = self.params["cont_batching"]
        if not isinstance(self.cont_batching, bool):
            raise ValueError(f"server_params cont_batching={self.cont_batching!r}: want true or false")
        draft_model = self.params["draft_model"]
        if draft_model is not None and not isinstance(draft_model, bool):
            raise ValueError(f"server_params draft_model={draft_model!r}: want true, false or null")
        self.draft_model: bool | None = draft_model
        self._slot_of: dict[str, int] = {}             # seq_id -> the slot it holds
        self._last_used = [0] * self.parallel          # per slot: the step it was last freed (LRU)
        self._steps = 0

    def plan_step(self) -> Plan:
        self._steps += 1
        self._launch()
        generating = [r for r in self.running if is_prefilled(r)]
        decodes, verifies = self._generating_rows(generating)
        used = len(decodes) + sum(v.k for v in verifies)
        prefills = self._prompt_spans(used) if (self.cont_batching or used == 0) else ()
        if not (prefills or decodes or verifies):
            return self.idle_plan()
        action, kind = _kinds(prefills, decodes, verifies)
        seq_ids = tuple(dict.fromkeys([*(p.seq_id for p in prefills), *(d[0] for d in decodes),
                                       *(v.seq_id for v in verifies)]))
        return Plan(action, kind, self.state(), seq_ids, prefills=prefills, decodes=decodes,
                    verifies=verifies, prefill_tokens=tuple(p.stop - p.start for p in prefills))

    # -- the pass, in the server's order --------------------------------------------------------
    def _launch(self) -> None:
        """Free the slots of rows that left, then give each waiting request (FIFO) a free slot: the
        least recently freed one, as the server picks when no cached prompt matches."""
        parallel = self.parallel
        live = {r.id for r in self.running}
        for seq_id in [s for s in self._slot_of if s not in live]:
            self._last_used[self._slot_of.pop(seq_id)] = self._steps
        while self.waiting and len(self._slot_of) < parallel and self.kv.num_free:
            held = set(self._slot_of.values())
            # ties go to the higher slot: the server keeps the last of equally old slots
            slot = min((i for i in range(parallel) if i not in held), key=lambda i: (self._last_used[i], -i))
            request = self.waiting[0]
            self.admit(request)
            self._slot_of[request.id] = slot

    def _generating_rows(self, generating: list[Request]) -> tuple[tuple[Decode, ...], tuple[Verify, ...]]:
        """Each generating slot's work: with a draft model, drafts up to its own cap (n_max, cut to
        its remaining tokens - 1; under n_min: none) and a verify of cap + 1 positions, else one
        decode token. One draft call serves every drafting slot (the executor drafts at the largest
        cap; a slot capped lower keeps the head of its drafts)."""
        caps = {r.id: self._draft_cap(r) for r in generating}
        decodes = tuple((r.id, _last(r)) for r in generating if caps[r.id] == 0)
        return decodes, tuple(Verify(r.id, _last(r), 1 + caps[r.id]) for r in generating if caps[r.id] > 0)

    @property
    def speculates(self) -> bool:
        """The server's own setting when the profile has it: llama-server speculates every slot
        with a draft model loaded, whatever a request asks."""
        return self.config.has_drafter if self.draft_model is None else self.draft_model

    def _draft_cap(self, request: Request) -> int:
        if not self.speculates:
            return 0
        cap = min(self.n_max, request.num_remaining - 1)
        return cap if cap >= max(1, self.n_min) else 0

    def _prompt_spans(self, used: int) -> tuple[Prefill, ...]:
        """Slots still processing their prompt, in slot order, each adding prompt tokens while the
        batch holds fewer than n_batch (a slot may take part of its prompt; the rest waits)."""
        n_batch = self.batch_size
        prompting = sorted((r for r in self.running if not is_prefilled(r)),
                           key=lambda r: self._slot_of[r.id])
        spans = []
        for request in prompting:
            if used >= n_batch:
                break
            span = self.span(request, n_batch - used)
            spans.append(span)
            used += span.stop - span.start
        return tuple(spans)


def _last(request: Request) -> int:
    assert request.last_token is not None, f"{request.id} generates without a sampled token"
    return request.last_token


def _whole(params: Mapping[str, object], name: str, low: int) -> int:
    value = params[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"server_params {name}={value!r}: want a whole number >= {low}")
    return value


def _kinds(prefills: Sequence[Prefill], decodes: Sequence[Decode],
           verifies: Sequence[Verify]) -> tuple[ActionKind, TickKind]:
    """The trace's names for the step: one forward over whatever rows it holds."""
    if verifies:
        if prefills or decodes:
            return ActionKind.FUSED, TickKind.FUSED
        return ActionKind.SPEC_ROUND, TickKind.ROUND
    if prefills and decodes:
        return ActionKind.MIXED, TickKind.MIXED
    if decodes:
        return ActionKind.DECODE, TickKind.DECODE
    whole = all(p.start == 0 and p.is_last for p in prefills)
    return ActionKind.PREFILL, TickKind.ADMIT if whole else TickKind.CHUNK
