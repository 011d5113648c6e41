"""llama.cpp's `timings` in every completion response, and the llamacpp:spec_decode_* counters.

Counted as upstream counts them: one draft per round, K draft tokens per round, and per round
the tokens it emitted minus one; a classic request has `draft_n = 0`.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from e2e_servers import clean_env, complete, complete_together, serve, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.parallel]  # counters and fields: no elapsed time is judged

SPEC_COUNTERS = ("llamacpp:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_draft_tokens_total",
                 "llamacpp:spec_decode_num_accepted_tokens_total", "coopsched_spec_rounds_total",
                 "coopsched_spec_draft_tokens_total")


def streamed(url: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        lines = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_timings_and_the_llamacpp_counters():
    requests = [("a speculative one", 40, True), ("another speculative", 33, True), ("a classic row", 25, False)]
    with serve("--decode-ms", "1", "--round-ms", "3") as served:
        before = served.metrics()
        responses = complete_together(served.url, requests)
        after = served.metrics()
    delta = {name: after[name] - before.get(name, 0.0) for name in SPEC_COUNTERS}
    accepted = 0
    for response, (_, _, speculative) in zip(responses, requests):
        t = response["timings"]
        assert t["predicted_n"] == response["usage"]["completion_tokens"] > 0
        assert t["prompt_n"] == response["usage"]["prompt_tokens"] and t["prompt_ms"] > 0
        burst = response["coopsched"]["burst"]
        if speculative:
            assert t["draft_kind"] == "mtp" and t["draft_rounds"] == burst["rounds"] > 0
            assert t["draft_n"] == 4 * t["draft_rounds"]  # K = 4 draft tokens per round
            assert 0 <= t["draft_n_accepted"] <= t["draft_n"]
            assert t["draft_n_accepted"] == burst["tokens_generated"] - 1 - burst["rounds"]
        else:
            assert (t["draft_n"], t["draft_n_accepted"], t["draft_rounds"], t["draft_kind"]) == (0, 0, 0, "none")
        accepted += t["draft_n_accepted"]
    rounds = delta["coopsched_spec_rounds_total"]
    assert delta["llamacpp:spec_decode_num_drafts_total"] == rounds > 0
    assert delta["llamacpp:spec_decode_num_draft_tokens_total"] == delta["coopsched_spec_draft_tokens_total"] + rounds
    assert delta["llamacpp:spec_decode_num_accepted_tokens_total"] == accepted > 0


def test_a_stream_carries_timings_in_its_final_chunks():
    body = {"messages": [{"role": "user", "content": "stream me"}], "max_tokens": 20, "temperature": 0,
            "stream_options": {"include_usage": True}}
    with serve("--decode-ms", "1", "--round-ms", "3") as served:
        chunks = streamed(served.url, body)
    finish = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["timings"] == finish["timings"]
    assert finish["timings"]["predicted_n"] == usage["usage"]["completion_tokens"] == 20
    assert finish["timings"]["draft_n"] > 0
    assert all("timings" not in c for c in chunks if c is not finish and c is not usage)


@pytest.mark.parametrize("mixed", [False, True], ids=["grant", "mixed-step"])
def test_serve_counts_its_grants_and_mixed_steps(mixed):
    """Three rows decode while a 400-token prompt prefills in chunks of 64: granted chunks (after two
    decode ticks each), or with MLXCEL_MIXED_STEP=1 mixed steps; /health says which."""
    env = clean_env(**({"MLXCEL_MIXED_STEP": "1"} if mixed else {}))
    with serve("--decode-ms", "1", "--prefill-chunk-tokens", "64", "--prefill-grant-interval", "2", env=env) as served:
        health = httpx.get(f"{served.url}/health").json()
        before = served.metrics()
        outs = [[] for _ in range(4)]
        jobs = [("row", 300, False)] * 3 + [("x" * 400, 4, False)]
        threads = [threading.Thread(target=lambda job=job, out=out: out.append(complete(served.url, *job)))
                   for job, out in zip(jobs, outs)]
        for thread in threads[:3]:
            thread.start()
        assert wait_for(lambda: served.metrics()["coopsched_requests_running"] >= 3)  # the rows decode first
        threads[3].start()
        for thread in threads:
            thread.join(timeout=60)
        after = served.metrics()
    assert (health["prefill_grant_interval"], health["mixed_step"], health["prefill_chunk_tokens"]) == (2, mixed, 64)
    assert all(out and out[0]["usage"]["completion_tokens"] > 0 for out in outs)
    grants = after["coopsched_prefill_grants_total"] - before["coopsched_prefill_grants_total"]
    steps = after["coopsched_mixed_steps_total"] - before["coopsched_mixed_steps_total"]
    assert (steps > 0, grants) == (True, 0) if mixed else (grants > 0, steps) == (True, 0)
