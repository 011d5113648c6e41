"""A server's own step books beside its twin's over the same held-out runs: llama-server's /metrics
counts its llama_decode calls, busy slots per call and drafts; the twin counts its steps, rows per
step and verify rows. Books that agree show the twin schedules as the server does, which token
timing alone cannot (`calibrate --report` keeps them for the llama.cpp kind).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

DECODES, BUSY = "llamacpp:n_decode_total", "llamacpp:n_busy_slots_per_decode"
DRAFTS, DRAFT_TOKENS = "llamacpp:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_draft_tokens_total"
KEYS = ("steps", "busy_per_step", "drafts", "draft_tokens")


def server_books(before: Mapping[str, float] | None, after: Mapping[str, float] | None) -> dict | None:
    """llama-server's books over one run, from the /metrics scrapes either side of it; None when a
    scrape lacks them (no --metrics). Its busy slots per decode is a running mean over every decode
    since it started: the run's own mean is undone from the two."""
    names = (DECODES, BUSY, DRAFTS, DRAFT_TOKENS)
    if not before or not after or any(n not in before or n not in after for n in names):
        return None
    steps = after[DECODES] - before[DECODES]
    busy = after[BUSY] * after[DECODES] - before[BUSY] * before[DECODES]
    return {"steps": steps, "busy_per_step": busy / steps if steps else None,
            "drafts": after[DRAFTS] - before[DRAFTS], "draft_tokens": after[DRAFT_TOKENS] - before[DRAFT_TOKENS]}


def twin_books(run) -> dict:
    """The same books of one twin run (runner.execute's result): its working steps, rows per step,
    verify rows (one draft each, as llama-server counts a slot's draft) and drafted tokens."""
    worked = [t for t in run.ticks if t.action.value != "idle"]
    obs = run.scheduler.obs
    return {"steps": len(worked), "busy_per_step": sum(len(t.request_ids) for t in worked) / len(worked)
            if worked else None, "drafts": obs.rounds, "draft_tokens": obs.drafted_tokens}


def mean_books(runs: Sequence[dict | None]) -> dict | None:
    """The live runs' books, averaged per key (None when a run had none)."""
    if not runs or any(r is None for r in runs):
        return None
    return {k: (None if any(r[k] is None for r in runs) else round(float(np.mean([r[k] for r in runs])), 4))
            for k in KEYS}


def books_line(name: str, books: Mapping[str, dict]) -> str:
    """One workload's books for the report's print-out: live, then each twin with its error."""
    live = books["live"]
    parts = []
    for key in KEYS:
        cells = [f"{key} live {_num(live[key])}"]
        for side, got in books.items():
            if side != "live":
                error = f" ({got[key] / live[key] - 1:+.0%})" if got[key] is not None and live[key] else ""
                cells.append(f"{side} {_num(got[key])}{error}")
        parts.append(", ".join(cells))
    return f"{name} books per run (the server's /metrics vs the twins' counts): " + "; ".join(parts)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
