"""mlx_lm.server's scheduler as a twin: continuous batching by its BatchGenerator, requests joining in
waves, and one request at a time, speculatively, once a draft model is loaded. Transcribed from
mlx-lm 0.32.2: mlx_lm/server.py (ResponseGenerator._generate, _serve_single, TimeBudget) and
mlx_lm/generate.py (BatchGenerator._next, speculative_generate_step).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from coopsched.core.append import Vocab
from coopsched.core.config import SchedulerConfig
from coopsched.core.kv import KVSlotPool
from coopsched.core.plan import Committed, Decode, Plan, Prefill, Result, Verify
from coopsched.core.request import Request
from coopsched.core.types import ActionKind, TickKind

from .base import Param, StepModel


@dataclass(slots=True)
class _Row:
    """Where mlx-lm has a batched request: its prompt steps still to run, or generating."""
    chunk_steps: int          # prompt forwards still owed (all prompt tokens but the last, in steps)
    generating: bool = False  # moved to the generation batch: its first token comes with the next decode


class MlxLmModel(StepModel):
    """One step is one `BatchGenerator.next()` (batched), or one forward of the single stream.

    Batched, each step: the generation batch decodes a token per row; if it is then at its cap,
    nothing else runs; else inserted requests join the prompt batch (first come first, at most
    `prompt_concurrency` in it and the cap's room), prompt rows with only their last token left move
    to generation, and the rest prefill their next `prefill_step_size` tokens in one forward. A row's
    first token comes out of the decode after its move, two steps after its last prompt forward.
    The server inserts requests only between time budgets: while it has rows it runs steps for
    `wave_ms`, then takes everything that queued meanwhile and starts the next budget at once (queued
    or not); an idle server takes a request at once.

    The twin prices a row's last prompt chunk, its move and its first decode as the one prefill span
    that yields its first token, in the step mlx-lm emits it (a lone request's calibrated TTFT is
    those forwards); earlier chunks are spans in their own steps.
    """
    kind = "mlx-lm"
    PARAMS = (
        Param("decode_concurrency", 32, "--decode-concurrency",
              "rows the generation batch decodes together (the cap is the larger of this and prompt_concurrency)"),
        Param("prompt_concurrency", 8, "--prompt-concurrency", "rows the prompt batch prefills together"),
        Param("prefill_step_size", 2048, "--prefill-step-size", "prompt tokens per row per prefill forward"),
        Param("wave_ms", 500.0, "TimeBudget(budget=0.5) in mlx_lm/server.py (no flag)",
              "how long the server runs steps before it inserts the requests that queued meanwhile"),
        Param("draft_model", False, "--draft-model",
              "a draft model is loaded: requests are served one at a time, speculatively"),
        Param("num_draft_tokens", 3, "--num-draft-tokens", "tokens the draft model proposes per round"),
    )

    def __init__(self, config: SchedulerConfig, params: Mapping[str, object] | None = None, *,
                 keep_history: bool = True, vocab: Vocab | None = None) -> None:
        super().__init__(config, params, keep_history=keep_history, vocab=vocab)
        for name in ("decode_concurrency", "prompt_concurrency", "prefill_step_size", "num_draft_tokens"):
            value = self.params[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"server_params {name}={value!r}: want an integer >= 1")
        wave = self.params["wave_ms"]
        if not isinstance(wave, (int, float)) or isinstance(wave, bool) or wave < 0:
            raise ValueError(f"server_params wave_ms={wave!r}: want a number of ms >= 0")
        # mlx_lm.server holds no slots: the pool holds what its batches can (the cap may be overshot
        # by one prefill batch, and another may be prefilling)
        self.kv = KVSlotPool(max(config.num_kv_slots, self.cap + 2 * self.param("prompt_concurrency")),
                             config.slot_tokens)
        self._rows: dict[str, _Row] = {}
        self._inserted: list[Request] = []  # in the generator's queue, not yet in its prompt batch
        self._now_ms = 0.0                  # the end of the last step: time arrives with each commit
        self._wave_start_ms = 0.0

    @property
    def speculates(self) -> bool:
        return bool(self.params["draft_model"])

    def param(self, name: str) -> int:
        value = self.params[name]
        assert isinstance(value, int)  # checked in __init__
        return value

    @property
    def wave_ms(self) -> float:
        value = self.params["wave_ms"]
        assert isinstance(value, (int, float))  # checked in __init__
        return float(value)

    @property
    def cap(self) -> int:
        """BatchGenerator's completion batch size: never below the prefill batch size."""
        return max(self.param("decode_concurrency"), self.param("prompt_concurrency"))

    def commit(self, plan: Plan, result: Result, start_ms: float, end_ms: float,
               arrivals: Sequence[Request] = ()) -> Committed:
        self._now_ms = max(self._now_ms, end_ms)
        return super().commit(plan, result, start_ms, end_ms, arrivals)

    def plan_step(self) -> Plan:
        self._forget_finished()
        if self.speculates:
            return self._single_stream()
        for _ in range(3):  # steps with no model work cost nothing: a lone row's own forwards are its span
            plan = self._batched()
            if plan.action is not ActionKind.IDLE or not self._rows:
                return plan
        return plan

    # -- the batched path ---------------------------------------------------------------------
    def _insert_wave(self) -> None:
        """The server loop (`ResponseGenerator._generate`): an idle server blocks on its queue and
        inserts a request at once; a busy one runs `BatchGenerator.next()` until its `TimeBudget` is
        spent, inserts what queued meanwhile, and starts the next budget, whether or not anything was
        queued. So a busy server's insertion points are chained wave_ms apart from its first insert,
        and a request arriving long after the last insertion still waits for the next one."""
        now = max([self._now_ms, *(r.arrival_ms for r in self.waiting)])
        if not self._rows and not self._inserted:
            self._wave_start_ms = now
        elif now - self._wave_start_ms > self.wave_ms:  # the step that just ended spent the budget
            self._wave_start_ms = now
        else:
            return
        self._inserted += [r for r in self.waiting if r not in self._inserted]

    def _batched(self) -> Plan:
        self._insert_wave()
        running = [r for r in self.running if r.id in self._rows]
        generating = [r for r in running if self._rows[r.id].generating]
        prompting = [r for r in running if not self._rows[r.id].generating]
        decodes = tuple((r.id, r.last_token) for r in generating if r.last_token is not None)
        firsts = [self.span(r) for r in generating if r.last_token is None]
        staying = sum(r.num_remaining > 1 for r in generating)  # still generating after this decode
        chunks: list[Prefill] = []
        if staying < self.cap:
            prompting += self._admit_prompts(len(prompting), staying)
            chunks = self._prompt_step(prompting)
        return self._plan(tuple(firsts + chunks), decodes)

    def _admit_prompts(self, num_prompting: int, num_generating: int) -> list[Request]:
        room = min(self.param("prompt_concurrency") - num_prompting, self.cap - num_generating,
                   len(self._inserted), self.kv.num_free)
        joined = self._inserted[:max(room, 0)]
        del self._inserted[:len(joined)]
        step = self.param("prefill_step_size")
        for request in joined:
            self.admit(request)
            self._rows[request.id] = _Row(math.ceil((len(request.prompt_token_ids) - 1) / step))
        return joined

    def _prompt_step(self, prompting: list[Request]) -> list[Prefill]:
        """Rows with only their last token left move to generation; the rest run one prompt forward
        (the twin's span for every chunk but the last, which it prices with the first token)."""
        step = self.param("prefill_step_size")
        spans = []
        for request in prompting:
            row = self._rows[request.id]
            if row.chunk_steps == 0:
                row.generating = True
                continue
            row.chunk_steps -= 1
            if row.chunk_steps:
                spans.append(self.span(request, step))
        return spans

    def _plan(self, prefills: tuple[Prefill, ...], decodes: tuple[Decode, ...]) -> Plan:
        ids = tuple(p.seq_id for p in prefills) + tuple(seq_id for seq_id, _ in decodes)
        if not ids:
            return self.idle_plan()
        tokens = tuple(p.stop - p.start for p in prefills) + (0,) * len(decodes)
        if prefills and decodes:
            return Plan(ActionKind.MIXED, TickKind.MIXED, self.state(), ids, prefills, decodes,
                        prefill_tokens=tokens)
        if decodes:
            return Plan(ActionKind.DECODE, TickKind.DECODE, self.state(), ids, decodes=decodes)
        kind = TickKind.ADMIT if all(p.is_last for p in prefills) else TickKind.CHUNK
        return Plan(ActionKind.PREFILL, kind, self.state(), ids, prefills, prefill_tokens=tokens)

    # -- the single stream (a draft model is loaded) -----------------------------------------------
    def _single_stream(self) -> Plan:
        """The request being served runs alone: its prompt (target and draft model), then rounds of
        up to `num_draft_tokens` drafts and one verify; the next waits for it to finish."""
        if not self.running:
            if not self.waiting or not self.kv.num_free:
                return self.idle_plan()
            self.admit(self.waiting[0])
        request = self.running[0]
        if not request.output_token_ids:
            span = self.span(request)
            return Plan(ActionKind.PREFILL, TickKind.ADMIT, self.state(), (request.id,), (span,))
        k = min(request.num_remaining, self.param("num_draft_tokens")) + 1
        assert request.last_token is not None  # it has a first token
        verify = Verify(request.id, request.last_token, k)
        return Plan(ActionKind.SPEC_ROUND, TickKind.ROUND, self.state(), (request.id,), verifies=(verify,))

    def _forget_finished(self) -> None:
        for seq_id in [s for s in self._rows if s not in self.requests]:
            del self._rows[seq_id]
        self._inserted = [r for r in self._inserted if r.id in self.requests and not r.is_finished]
