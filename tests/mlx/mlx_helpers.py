"""Helpers of the MLX tests (fixtures live in conftest.py)."""

from __future__ import annotations

from coopsched.clock import RealClock
from coopsched.core import Request, Scheduler, SchedulerConfig
from coopsched.engine import Engine

NUM_PROMPTS = 20
MAX_TOKENS = 20
BLOCK_SIZE = 4


def make_requests(prompts, *, max_tokens: int = MAX_TOKENS, speculative=True, arrival_step_ms: float = 0.0,
                  prefix: str = "r") -> list[Request]:
    """Requests over `prompts`; `speculative` is a bool or a function of the index."""
    spec = speculative if callable(speculative) else (lambda _i: speculative)
    return [Request(f"{prefix}{i}", p, max_tokens, speculative=spec(i), arrival_ms=i * arrival_step_ms)
            for i, p in enumerate(prompts)]


def make_scheduler(**config) -> Scheduler:
    return Scheduler(SchedulerConfig(block_size=BLOCK_SIZE, **config))


def run(backend, requests, on_event=None, scheduler=None, **config):
    """Run requests to completion on a real clock; returns (scheduler, RunResult)."""
    scheduler = scheduler or make_scheduler(**config)
    result = Engine(scheduler, backend, RealClock(), on_event=on_event).run(requests)
    return scheduler, result


def record_drafts(backend) -> dict[str, list[list[int]]]:
    """Every proposal list the backend's drafter returns, per sequence, in round order."""
    seen: dict[str, list[list[int]]] = {}
    real_draft = backend.draft

    def draft(rows, num_tokens):
        proposals = real_draft(rows, num_tokens)
        for (seq_id, _), row in zip(rows, proposals):
            seen.setdefault(seq_id, []).append(list(row))
        return proposals
    backend.draft = draft
    return seen


def expected(oracle, request, eos: int) -> list[int]:
    """What serving must emit: the oracle's greedy tokens up to max_tokens, cut before EOS."""
    want = oracle(request.prompt_token_ids, max(request.max_tokens, MAX_TOKENS) + BLOCK_SIZE)[: request.max_tokens]
    return want[: want.index(eos)] if eos in want else want


def mismatches(requests, oracle, eos: int) -> list[str]:
    return [r.id for r in requests if r.output_token_ids != expected(oracle, r, eos)]
