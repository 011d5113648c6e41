"""A client that disconnects cancels its request: the row stops and its KV slot is freed."""

from __future__ import annotations

import httpx
import pytest
from e2e_servers import wait_for

from harness.live.client import stream

pytestmark = pytest.mark.e2e

# Left alone, 3000 tokens take >= 3 s at 1 ms per decode step (longer with rounds), well past the wait below.
LONG = {"prompt": "never finishes", "max_tokens": 3000, "temperature": 0}


def slots_and_running(server) -> tuple[float, float]:
    m = server.metrics()
    return m["coopsched_kv_slots_in_use"], m["coopsched_requests_running"]


@pytest.mark.parametrize("speculative", [False, True], ids=["classic", "speculative"])
def test_stream_disconnect_frees_the_slot(server, speculative):
    before = slots_and_running(server)
    events = stream(server.url, {**LONG, "speculative": speculative})
    for _ in range(5):
        next(events)
    assert slots_and_running(server)[0] == before[0] + 1  # held while streaming
    events.close()  # closes the connection mid-stream
    assert wait_for(lambda: slots_and_running(server) == before, timeout_s=2.0), slots_and_running(server)


def test_non_stream_disconnect_frees_the_slot(server):
    before = slots_and_running(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=LONG, timeout=httpx.Timeout(10, read=0.3))
    assert wait_for(lambda: slots_and_running(server) == before, timeout_s=2.0), slots_and_running(server)
