"""A capacity rung past the server's capacity is given up once hopeless: against a fake that serves one
request at a time, 24 requests cannot meet a 200 ms TTFT for 90% of them, so the client stops sending
and cuts the open streams. What comes back says which were abandoned (cut, or never sent because the
rung was over before they were due), the rows keep the tokens that arrived, and the same run without
a way out serves every request."""

from __future__ import annotations

import sys
from pathlib import Path

from e2e_servers import serve

from harness.calibrate import search, target
from harness.run.scenario import RequestSpec
from harness.run.slo import Slo

FAKE = Path(__file__).with_name("multitoken_server.py")
SPECS = [RequestSpec(f"r{i}", 0.0, 8, max_tokens=8, speculative=False) for i in range(24)]


def test_a_hopeless_rung_stops_and_says_which_requests_it_abandoned():
    with serve(command=[sys.executable, str(FAKE), "--serialize", "--decode-ms", "10"]) as served:
        server = target.Server.connect(served.url)
        give_up = search.GiveUp.of(Slo(ttft_ms=200), len(SPECS), 0.9)
        rows = target.measure_workload(server, SPECS, 7, give_up)
        assert give_up.gave_up_after is not None and give_up.gave_up_after <= len(SPECS)
        finished = [r for r in rows if r["num_tokens"] == 8]
        cut = [r for r in rows if r["num_tokens"] < 8]
        assert finished and len(cut) > give_up.allowed  # more cut than the rung could have missed
        assert len(rows) == len(SPECS)
        plain = target.measure_workload(server, SPECS[:6], 8)  # the server still serves, and in full without one
        assert [r["num_tokens"] for r in plain] == [8] * 6


def test_requests_not_yet_due_are_never_sent_once_given_up():
    """Arrivals every 100 ms, each served in 320 ms: the rung is hopeless well before the last is due
    (2.3 s in), and those never go."""
    with serve(command=[sys.executable, str(FAKE), "--serialize", "--decode-ms", "40"]) as served:
        server = target.Server.connect(served.url)
        give_up = search.GiveUp.of(Slo(ttft_ms=200), len(SPECS), 0.9)
        bodies = [server.body("abcdefgh", 8, False) for _ in SPECS]
        outs = server.together(bodies, [100.0 * i for i in range(len(SPECS))], give_up)
        unsent = [o for o in outs if not o.sent_ns]
        assert unsent and all(o.abandoned and not o.arrivals for o in unsent)
        assert give_up.gave_up_after == len(SPECS) - len(unsent)
        assert all(o.done and not o.abandoned for o in outs if len(o.token_ids) == 8)
