"""/metrics agrees with a virtual-time run of the same requests: rounds, drafts, accepted, bursts.

Acceptance in the mock is a function of (seq_id, round index) and the target of
the context, so the counts do not depend on timing: the server (real time, over
HTTP) and the engine (virtual time, in process) must report the same numbers.
"""

from __future__ import annotations

import json

import pytest
from e2e_servers import clean_env, complete_together, serve

from coopsched.clock import ManualClock
from coopsched.core import Request, SamplingParams, Scheduler
from coopsched.engine import Engine
from coopsched.env import Gates
from harness.calibrate import books
from mocks import CostModel, MockBackend, MockDrafter

pytestmark = [pytest.mark.e2e, pytest.mark.parallel]  # no wall-clock verdict: may run beside another test

# (prompt, max_tokens, speculative): two speculative, one classic, sent together
REQUESTS = [("metrics agree", 60, True), ("with the trace", 45, True), ("classic row", 80, False)]
COUNTERS = {"coopsched_spec_rounds_total": "rounds", "coopsched_spec_draft_tokens_total": "drafted_tokens",
            "coopsched_spec_accepted_tokens_total": "accepted_tokens", "coopsched_spec_slices_total": "slices"}


def reference(responses: list[dict]):
    """The same requests (same ids) through the engine in virtual time."""
    clock = ManualClock()
    backend = MockBackend(clock, CostModel.simple(2.0, 8.0, 0.2), drafter=MockDrafter(0.7, seed=0))
    scheduler = Scheduler(Gates.parse({}).scheduler_config(num_kv_slots=32))
    requests = [Request(r["id"], tuple(r["choices"][0]["prompt_token_ids"]), max_tokens=mt,
                        sampling=SamplingParams(0.0), speculative=spec)
                for r, (_, mt, spec) in zip(responses, REQUESTS)]
    Engine(scheduler, backend, clock).run(requests)
    return scheduler, requests


def test_metrics_agree_with_the_virtual_time_trace():
    with serve("--decode-ms", "2", "--round-ms", "8", env=clean_env()) as served:
        before = served.metrics()
        responses = complete_together(served.url, REQUESTS, return_token_ids=True)
        after = served.metrics()
        served.stop()  # the log is complete once the server has exited
        log = [json.loads(line) for line in served.log if line.startswith('{"event": "BurstFinalized"')]

    scheduler, requests = reference(responses)
    obs = scheduler.obs
    for name, field in COUNTERS.items():
        assert after[name] - before.get(name, 0.0) == getattr(obs, field), name
    assert obs.rounds > 0 and obs.accepted_tokens > 0
    burst_count = "coopsched_burst_wall_seconds_count"
    assert after[burst_count] - before[burst_count] == len(obs.bursts) == 2

    # the BurstFinalized log and the per-response extension carry the same records
    expected = {b.seq_id: b for b in obs.bursts}
    assert sorted(r["seq_id"] for r in log) == sorted(expected)
    for record in log:
        ref = expected[record["seq_id"]]
        assert (record["rounds"], record["accepted_draft_tokens"], record["slices"], record["tokens_generated"]) \
            == (ref.rounds, ref.accepted_draft_tokens, ref.slices, ref.tokens_generated)
    for response, request in zip(responses, requests):
        assert response["choices"][0]["token_ids"] == request.output_token_ids
        burst = response["coopsched"]["burst"]
        assert (burst["rounds"] if burst else None) == (expected[request.id].rounds if request.speculative
                                                         else None)

    # every token made one ITL sample (zero within a round) and every request one TTFT sample
    gaps = {"spec": 0, "classic": 0}
    for request in requests:
        gaps["spec" if request.served_speculatively else "classic"] += len(request.output_token_ids) - 1
    for kind, count in gaps.items():
        name = f'coopsched_inter_token_latency_seconds_count{{kind="{kind}"}}'
        assert after[name] - before[name] == count
    ttft = "coopsched_time_to_first_token_seconds_count"
    assert after[ttft] - before[ttft] == len(REQUESTS)
    assert after["coopsched_kv_slots_in_use"] == 0 and after["coopsched_requests_running"] == 0

    # the step books: one round tick per round, each at least its 8 ms sleep, and the ticks' wall
    # time inside the worker's busy time (real time: no upper bound)
    ticks, busy_ms = books.tick_delta(before, after)
    rounds = [v for (kind, _), v in ticks.items() if kind in ("round", "grant")]
    assert sum(n for n, _ in rounds) == obs.rounds
    assert sum(ms for _, ms in rounds) >= 8.0 * obs.rounds
    assert {kind for kind, _ in ticks} >= {"slice0", "round", "admit", "decode"}
    assert 0 < sum(ms for _, ms in ticks.values()) <= busy_ms
