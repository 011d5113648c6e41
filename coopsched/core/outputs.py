"""What a tick's Result does to the rows it names: prefill progress, tokens, acceptance, failures.

`Scheduler.commit` calls these with the plan, the result and the live requests; they add the
tick's token events (and rewinds, releases) to the lists they are given.
"""

from __future__ import annotations

from collections.abc import Mapping

from .append import Vocab, append
from .plan import Plan, Result
from .request import Request, RequestState
from .spec import SpecJob
from .types import FinishReason, TokenEvent


def append_result(plan: Plan, result: Result, requests: Mapping[str, Request], job: SpecJob | None, vocab: Vocab,
                  end_ms: float, events: list[TokenEvent], rewinds: list[tuple[str, int]]) -> tuple[int, int, int]:
    """Slice 0 or classic prefills, then the round's walk, then the decodes; returns the round's
    (rows, drafts, accepted drafts). `job`: the speculative job the plan serves, if any."""
    if job is not None and not job.is_begun:
        for row in plan.prefills:
            requests[row.seq_id].num_prefilled = row.stop
        done = [(row.seq_id, first) for row, first in zip(plan.prefills, result.firsts)]
        events += job.finish_chunk(job.live_rows, done, vocab, end_ms)
    elif plan.prefills:
        append_prefills(plan, result, requests, vocab, end_ms, events)
    counts = (0, 0, 0)
    if plan.verifies and job is not None:
        rows = [requests[v.seq_id] for v in plan.verifies]
        made, rewound, accepted = job.finish_round(rows, result.drafts, result.targets, vocab, end_ms)
        events += made
        rewinds += rewound
        counts = (len(rows), len(rows) * (job.block_size - 1), accepted)
    for (seq_id, _), token in zip(plan.decodes, result.tokens):
        tokens, reason = append(requests[seq_id], (token,), vocab)
        events.append(TokenEvent(seq_id, tokens, end_ms, reason))
    return counts


def append_prefills(plan: Plan, result: Result, requests: Mapping[str, Request], vocab: Vocab, end_ms: float,
                    events: list[TokenEvent], failed: tuple[str, ...] = ()) -> None:
    """Classic prefills that ran: their progress, and a finished prompt's first token. A mixed tick
    whose decode failed after its prefill ran keeps the chunk (the cache holds it)."""
    for row, first in zip(plan.prefills, result.firsts):
        if row.seq_id in failed:
            continue
        request = requests[row.seq_id]
        request.num_prefilled = row.stop
        if first is not None:
            tokens, reason = append(request, (first,), vocab)
            events.append(TokenEvent(row.seq_id, tokens, end_ms, reason))


def fail_rows(plan: Plan, result: Result, requests: Mapping[str, Request], job: SpecJob | None,
              events: list[TokenEvent], releases: list[str]) -> tuple[str, ...]:
    """A model call failed: its rows end with the error, every other row carries on. A slice 0 that
    failed for a sibling starts over for the rest. Returns the rows the tick's record names."""
    members = {seq_id for seq_id, _ in plan.decodes}
    members.update(job.ids if job is not None else [row.seq_id for row in plan.prefills])
    failed = [seq_id for seq_id in result.failed if seq_id in members]
    for seq_id in failed:
        request = requests[seq_id]
        if not request.is_finished:
            request.state, request.finish_reason = RequestState.FINISHED, FinishReason.ERROR
            request.error = result.error
            events.append(TokenEvent(seq_id, (), 0.0, FinishReason.ERROR))
    if job is not None and not job.is_begun and job.live_rows:
        job.firsts.clear()
        for request in job.live_rows:
            releases.append(request.id)
            request.num_prefilled = 0
    return tuple(dict.fromkeys([*failed, *plan.job_ids]))
