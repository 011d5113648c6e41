"""A request cancelled mid-stream releases its caches at once (the backend's live count and
the KV slot pool drop back), and its neighbours, including rows of the same merged classic
batch, keep producing exactly the oracle's tokens."""

from __future__ import annotations

import pytest
from mlx_helpers import expected, make_requests, make_scheduler, mismatches, run

pytestmark = pytest.mark.mlx


@pytest.mark.parametrize("mode", ["slice", "burst"])
@pytest.mark.parametrize("victim", ["r1", "r4"], ids=["classic-in-batch", "speculative"])
def test_cancel_mid_stream_releases_caches(backend, prompts, oracle, mode, victim):
    requests = make_requests(prompts[:5], max_tokens=40, speculative=lambda i: i == 4)
    target = next(r for r in requests if r.id == victim)
    scheduler = make_scheduler(mode=mode)
    seen = {"cancelled": False, "at_finish": None, "live_at_cancel": None}
    live_before = backend.num_live

    def on_event(event):
        if event.seq_id != victim:
            return
        if event.finish_reason is None and len(target.output_token_ids) >= 3 and not seen["cancelled"]:
            seen["cancelled"] = scheduler.cancel(victim)
            seen["live_at_cancel"] = backend.num_live
        elif event.finish_reason is not None:  # finalized in this very tick
            seen["at_finish"] = (backend.num_live, scheduler.kv.num_in_use, seen["live_at_cancel"])

    run(backend, requests, on_event=on_event, scheduler=scheduler)

    want = expected(oracle, target, backend.eos_token_id)
    if mode == "burst" and victim == "r4":
        # A legacy burst runs to completion inside one tick: no cancel can land mid-stream.
        assert not seen["cancelled"] and target.output_token_ids == want
    else:
        assert seen["cancelled"]
        assert 3 <= len(target.output_token_ids) < target.max_tokens
        assert target.output_token_ids == want[: len(target.output_token_ids)]
        num_live, slots_in_use, live_at_cancel = seen["at_finish"]
        assert num_live == slots_in_use == live_at_cancel - 1, "the cancelled request still holds caches"
    assert mismatches([r for r in requests if r is not target], oracle, backend.eos_token_id) == []
    assert backend.num_live == live_before == 0
