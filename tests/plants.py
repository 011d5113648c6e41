"""Planted bugs: each removes one piece of handling, so a test can show that the state
machine and `coopsched simulate` catch its absence. `apply(name, monkeypatch)`.

Each entry: the handling it removes, and the fault mix that exercises it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import replace

import pytest

import coopsched.core.append as append_module
import coopsched.core.books as books_module
import coopsched.core.scheduler as scheduler_module
import coopsched.executor as executor_module
from coopsched.core import upstream_rule
from coopsched.core.append import append
from coopsched.core.kv import KVSlotPool
from coopsched.core.request import SamplingParams
from coopsched.core.spec import SpecJob

Scheduler = scheduler_module.Scheduler


def _yield_flag(mp):
    """The yield flag never sets: speculative rounds take every tick under contention."""
    mp.setattr(books_module, "next_yield_flag", lambda last_was_spec, action: False)


def _slot_release(mp):
    """Finished requests keep their KV slot."""
    mp.setattr(KVSlotPool, "release", lambda self, seq_id: None)


def _cancel_ignored_in_round(mp):
    """A speculative round ignores the cancel flag (a vanished client keeps generating)."""
    start_round = SpecJob.start_round

    def ignoring(self):
        flagged = [r for r in self.live_rows if r.is_cancelled]
        for request in flagged:
            request.is_cancelled = False
        try:
            return start_round(self)
        finally:
            for request in flagged:
                request.is_cancelled = True
    mp.setattr(SpecJob, "start_round", ignoring)


def _cancelled_row_decoded(mp):
    """The reaper finishes a cancelled classic row but leaves it in the batch (the bug fixed)."""
    reap = scheduler_module.Scheduler._reap_cancelled

    def leaving_rows(self):
        running = list(self.running)
        reap(self)
        self.running[:] = running
    mp.setattr(scheduler_module.Scheduler, "_reap_cancelled", leaving_rows)


def _admission_ignores_kv(mp):
    """Admission does not wait for a free KV slot."""
    tick_state = scheduler_module.Scheduler.tick_state

    def ignoring(self):
        return tick_state(self)._replace(num_admissible=len(self.queue))
    mp.setattr(scheduler_module.Scheduler, "tick_state", ignoring)


def _error_not_contained(mp):
    """A failed model call takes the whole scheduler down instead of its requests."""
    def reraise(self, plan, result, releases):
        raise executor_module.BackendError(result.error or "", result.failed)
    mp.setattr(Scheduler, "_fail", reraise)


def _plain_exception_escapes(mp):
    """No guard: a backend's plain exception is not turned into a per-request error."""
    mp.setattr(executor_module, "guard", lambda seq_ids, call, *args: call(*args))


def _window_commits_early(mp):
    """Slice 0 (the old order) begins the job before its prefills and appends each row's first token
    as its prefill returns, streaming them only once every prefill returned: a failure loses them."""
    fail = Scheduler._fail

    def appending(self, plan, result, releases):
        if plan.job_ids and not plan.prefill_batched and self.job is not None:
            self.job.is_begun = True
            for row, first in zip(plan.prefills, result.firsts):
                append(self.requests[row.seq_id], [first], self.vocab)
        return fail(self, plan, result, releases)
    mp.setattr(Scheduler, "_fail", appending)


def _burst_drops_earlier_rounds(mp):
    """A failure late in a legacy burst loses the tokens its earlier rounds appended."""
    fail = Scheduler._fail

    def forgetting(self, plan, result, releases):
        self.books.events.clear()
        self.books.num_early = 0
        return fail(self, plan, result, releases)
    mp.setattr(Scheduler, "_fail", forgetting)


def _chunk_progress_kept(mp):
    """A failed chunk of slice 0 frees the siblings' caches but keeps their prefill progress."""
    fail = Scheduler._fail

    def remembering(self, plan, result, releases):
        rows = [self.requests[i] for i in plan.job_ids]
        progress = {r.id: r.num_prefilled for r in rows}
        touched = fail(self, plan, result, releases)
        for request in rows:
            if not request.is_finished:
                request.num_prefilled = progress[request.id]
        return touched
    mp.setattr(Scheduler, "_fail", remembering)


def _prefill_never_yields(mp):
    """With chunking, a prefill tick never hands the next tick to the decode rows."""
    tick_state = scheduler_module.Scheduler.tick_state
    mp.setattr(scheduler_module.Scheduler, "tick_state", lambda self: tick_state(self)._replace(prefill_yields=False))


def _grant_never_fires(mp):
    """The prefill grant never fires: a chunked prompt beside decode rows waits for the batch to drain."""
    mp.setattr(upstream_rule, "grant_due", lambda state: False)


def _stop_before_min_tokens(mp):
    """A stop string ends a request before its min_tokens (the rule vLLM does not have)."""
    real = append_module.append_tokens

    def early(request, tokens, vocab):
        sampling = request.sampling
        request.sampling = replace(sampling, min_tokens=0)
        try:
            return real(request, tokens, vocab)
        finally:
            request.sampling = sampling
    for module in list(sys.modules.values()):  # wherever the core imported it by name
        if getattr(module, "__name__", "").startswith("coopsched.") and getattr(module, "append_tokens", None) is real:
            mp.setattr(module, "append_tokens", early)


def _eos_before_min_tokens(mp):
    """The model may sample EOS before min_tokens (only ignore_eos masks it)."""
    mp.setattr(SamplingParams, "suppresses_eos", lambda self, output_index: self.ignore_eos)


# name -> (plant, fault mix for `coopsched simulate` that exercises the handling it removes;
# None: too rare in its seeds, so a scripted test shows it instead)
PLANTS = {
    "yield-flag": (_yield_flag, "none"),
    "slot-release": (_slot_release, "none"),
    "cancel-ignored-in-round": (_cancel_ignored_in_round, "disconnect-verify"),
    "cancelled-row-decoded": (_cancelled_row_decoded, "cancel"),
    "admission-ignores-kv": (_admission_ignores_kv, "kv"),
    "error-not-contained": (_error_not_contained, "backend"),
    "drafter-error-not-contained": (_error_not_contained, "drafter"),
    "plain-exception-escapes": (_plain_exception_escapes, "backend,drafter"),
    "window-commits-early": (_window_commits_early, None),  # a window sibling's slice 0 failing
    "burst-drops-earlier-rounds": (_burst_drops_earlier_rounds, "backend"),
    "chunk-progress-kept": (_chunk_progress_kept, None),  # a window's later chunk failing
    "prefill-never-yields": (_prefill_never_yields, "none"),
    "grant-never-fires": (_grant_never_fires, "none"),
    "stop-before-min-tokens": (_stop_before_min_tokens, "none"),
    "eos-before-min-tokens": (_eos_before_min_tokens, "none"),
}


def apply(name: str, monkeypatch) -> str | None:
    """Plant the bug; return its fault mix."""
    plant, faults = PLANTS[name]
    plant(monkeypatch)
    return faults


def caught(plants: Mapping[str, tuple[Callable, Callable[[], None]]]):
    """A module's test that each plant is caught: `plants` maps a name to (plant, check), and with
    the plant applied (it takes the monkeypatch) its check must fail. Assign the result to a
    module-level `test_...` name."""
    @pytest.mark.parametrize("name", list(plants))
    def test_planted_regression_is_caught(name, monkeypatch):
        plant, check = plants[name]
        plant(monkeypatch)
        with pytest.raises(AssertionError):
            check()
    return test_planted_regression_is_caught
