"""`return_tick_times`: each streamed token event carries its engine tick end and its SSE write time.

Both are perf_counter_ns (CLOCK_MONOTONIC), so on the same machine tick end <= written <= read,
and a round's tokens share one tick end. Without the flag the stream is plain OpenAI.
"""

from __future__ import annotations

import pytest

from harness.live import client, stalls

pytestmark = [pytest.mark.e2e, pytest.mark.parallel]  # stamps in order on one clock, never a duration


def body(**extra) -> dict:
    return {"prompt": "Speculate, then verify.", "max_tokens": 24, "temperature": 0, "return_token_ids": True,
            **extra}


def test_every_token_event_is_stamped_in_order(server):
    got = client.collect(server.url, body(return_tick_times=True))
    assert got.done and got.error is None
    stamped = [a for a in got.arrivals if a.n_tokens]
    assert len(stamped) == 24
    for a in stamped:
        stamps = a.event["coopsched"]
        assert stamps["tick_end_ns"] <= stamps["sent_ns"] <= a.time_ns
    ticks = [a.event["coopsched"]["tick_end_ns"] for a in stamped]
    assert ticks == sorted(ticks) and len(set(ticks)) < len(ticks)  # a round's tokens share their tick
    stream = stalls.Stream.of("spec", "spec", got)
    assert stream.ticks_ns is not None and len(stream.ticks_ns) == len(stream.arrivals_ns) == 24


def test_without_the_flag_events_carry_no_stamps(server):
    got = client.collect(server.url, body())
    assert got.done and all("tick_end_ns" not in (a.event.get("coopsched") or {}) for a in got.arrivals)
    assert stalls.Stream.of("spec", "spec", got).ticks_ns is None
