"""`coopsched run concurrency2 --target URL`: the harness catches a real server's head-of-line block.

Against `coopsched serve` in slice mode it passes, in burst mode it fails; against
`mlx_lm.server --draft-model` (which serves requests one at a time) the block shows
as the speculative request's TTFT, not as an ITL gap, and the run fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_servers import clean_env, serve

from harness.live.client import free_port

pytestmark = pytest.mark.e2e


def run_target(url: str, tmp_path, name: str = "concurrency2") -> tuple[int, dict, str]:
    trace_path = tmp_path / "trace.json"
    proc = subprocess.run([sys.executable, "-m", "coopsched.cli", "run", name, "--target", url,
                           "--json", str(trace_path)], capture_output=True, text=True, timeout=300,
                          env=clean_env())
    trace = json.loads(trace_path.read_text())[0] if trace_path.exists() else {}
    return proc.returncode, trace, proc.stdout + proc.stderr


def checks_of(trace: dict) -> dict:
    return {c["name"]: c for c in trace["checks"]}


def test_mock_server_slice_passes_and_burst_fails(tmp_path):
    with serve() as served:  # the mock: decode 5 ms, round 30 ms
        code, trace, output = run_target(served.url, tmp_path)
    assert code == 0, output
    assert trace["mode"] == "slice" and trace["clock"] == "real" and trace["ticks"] == []  # not visible over HTTP
    assert {r["id"]: r["eligible"] for r in trace["requests"]} == {"classic": False, "spec": True}
    assert {"ttft", "classic_itl", "burst_wall"} <= set(checks_of(trace))
    assert [b["seq_id"] for b in trace["bursts"]] == ["spec"]  # the server reports its BurstFinalized

    with serve(env=clean_env(MLXCEL_MTP_TICK_SLICE="0")) as served:
        code, trace, output = run_target(served.url, tmp_path)
    assert code != 0, output
    checks = checks_of(trace)
    assert trace["mode"] == "burst" and not checks["classic_itl"]["ok"] and not checks["ttft"]["ok"]


@pytest.fixture(scope="module")
def tiny_models():
    pytest.importorskip("mlx_lm")
    from coopsched.backends.model_build import ensure_tiny_models

    return ensure_tiny_models()


def test_mlx_lm_server_with_a_draft_model_fails_on_ttft(tmp_path, tiny_models):
    target, draft = tiny_models
    port = free_port()
    command = [sys.executable, "-m", "mlx_lm", "server", "--model", str(target), "--draft-model", str(draft),
               "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"]
    with serve(command=command, port=port, env=clean_env(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")) \
            as served:
        code, trace, output = run_target(served.url, tmp_path)
    checks = checks_of(trace)
    assert code != 0, output
    assert "solo" in trace and trace["bursts"] == []  # no costs reported: judged against solo runs
    ttft = checks["ttft_vs_solo"]
    assert not ttft["ok"] and "worst: spec" in ttft["note"]  # it waited out the classic generation
    assert checks["stall_vs_solo"]["ok"]  # ... which no ITL gap shows


def test_coopsched_serve_on_mlx_passes_against_solo_figures(tmp_path, tiny_models):
    """It reports no costs but its block size: R is K, not the one token each event carries."""
    target, draft = tiny_models
    with serve("--backend", "mlx", "--model", str(target), "--draft-model", str(draft),
               env=clean_env(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")) as served:
        code, trace, output = run_target(served.url, tmp_path)
    assert code == 0, output
    assert "solo" in trace and checks_of(trace)["ttft_vs_solo"]["ok"]
    assert trace["server"]["health"]["block_size"] == 4 and "A = 1 x R 4" in checks_of(trace)["stall_vs_solo"]["note"]


@pytest.mark.parallel  # BurstFinalized records against /metrics counters, never a time
def test_trace_bursts_agree_with_metrics():
    """One run seen twice: the --target trace's BurstFinalized records and the /metrics counters."""
    from harness.live.http_target import run_against_target
    from harness.run.scenario import load

    with serve("--decode-ms", "2", "--round-ms", "8") as served:
        before = served.metrics()
        trace = run_against_target(load("rotation"), served.url, 0, warm=False)
        after = served.metrics()
    # timing checks are the other tests' business (this server is cold: no warm-up here)
    assert next(c for c in trace["checks"] if c["name"] == "completed")["ok"], trace["checks"]
    bursts = trace["bursts"]
    assert sorted(b["seq_id"] for b in bursts) == ["spec-a", "spec-b"]
    delta = lambda name: after[name] - before[name]
    assert delta("coopsched_burst_wall_seconds_count") == len(bursts)
    assert delta("coopsched_spec_rounds_total") == sum(b["rounds"] for b in bursts) > 0
    assert delta("coopsched_spec_accepted_tokens_total") == sum(b["accepted_draft_tokens"] for b in bursts)
    assert delta("coopsched_spec_draft_tokens_total") == sum(b["drafted_tokens"] for b in bursts)
    assert delta("coopsched_spec_slices_total") == sum(b["slices"] for b in bursts)
    # the llama.cpp counters the trace read, and each response's timings, say the same
    counted = trace["server"]["spec_counters"]
    assert counted["drafts"] == delta("coopsched_spec_rounds_total") == delta("llamacpp:spec_decode_num_drafts_total")
    assert counted["accepted"] == sum(r["timings"]["draft_n_accepted"] for r in trace["requests"])
    assert all(r["timings"]["predicted_n"] == r["num_tokens"] for r in trace["requests"])


@pytest.mark.parallel  # tokens counted per event, never how fast
@pytest.mark.parametrize("stream_kind", ["token-ids", "text-and-usage"])
def test_target_counts_the_tokens_of_multi_token_events(tmp_path, stream_kind):
    """A server that sends 3 tokens per speculative event and reports no costs: every request has its
    max_tokens tokens in the trace (not one per event), judged against its solo run."""
    fake = Path(__file__).with_name("multitoken_server.py")
    args = ["--tokens-per-event", "3"] + (["--text-only"] if stream_kind == "text-and-usage" else [])
    with serve(command=[sys.executable, str(fake), *args]) as served:
        _code, trace, output = run_target(served.url, tmp_path)
    by_id = {r["id"]: r for r in trace["requests"]}
    assert (by_id["classic"]["num_tokens"], by_id["spec"]["num_tokens"]) == (128, 96), output
    assert "solo" in trace and checks_of(trace)["completed"]["ok"]
    spec_times = by_id["spec"]["token_times_ms"]
    assert spec_times[0] == spec_times[1] == spec_times[2] < spec_times[3]  # one arrival of 3 tokens
