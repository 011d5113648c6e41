"""aiperf (NVIDIA's benchmark client) profiles a mock `coopsched serve` on loopback: streaming chat
with vLLM's ignore_eos/min_tokens, every request completes with no error and the per-request
records land in profile_export.jsonl. Run it with `tox -e aiperf` (aiperf is not in the other envs).

aiperf counts tokens with a Hugging Face tokenizer; the test gives it a local one (the tiny
models' BPE), and points the hub at a closed loopback port so nothing can leave the machine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_servers import clean_env, serve

pytestmark = pytest.mark.e2e

pytest.importorskip("aiperf", reason="aiperf is not installed here: run `tox -e aiperf` (pip install aiperf==0.13.0)")

NUM_REQUESTS = 8
OUTPUT_TOKENS = 16


def aiperf_command() -> list[str]:
    script = Path(sys.executable).with_name("aiperf")
    return [str(script)] if script.exists() else [shutil.which("aiperf") or "aiperf"]


def local_tokenizer(out: Path) -> Path:
    from coopsched.backends import model_build

    out.mkdir()
    model_build.build_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": model_build.EOS_TOKEN}))
    return out


def aiperf_env() -> dict:
    env = clean_env()
    # aiperf reads a local tokenizer only when the hub is not "offline" (offline, it asks the hub
    # cache for a repo id); any hub call goes to a closed loopback port instead of the internet
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(name, None)
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_DISABLE_TELEMETRY="1", NO_COLOR="1")
    return env


def test_aiperf_profiles_streaming_chat_without_errors(tmp_path):
    tokenizer = local_tokenizer(tmp_path / "tokenizer")
    artifacts = tmp_path / "artifacts"
    with serve("--decode-ms", "1", "--round-ms", "4", "--eos-rate", "0.2") as served:
        command = [*aiperf_command(), "profile", "--model", "coopsched-mock", "--url", served.url,
                   "--endpoint-type", "chat", "--streaming", "--request-count", str(NUM_REQUESTS),
                   "--concurrency", "2", "--isl", "32", "--osl", str(OUTPUT_TOKENS), "--tokenizer", str(tokenizer),
                   "--random-seed", "0", "--ui", "none", "--no-server-metrics", "--no-gpu-telemetry",
                   "--use-server-token-count", "--artifact-dir", str(artifacts),
                   "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{OUTPUT_TOKENS}"]
        run = subprocess.run(command, cwd=tmp_path, env=aiperf_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    records = [json.loads(line) for line in (artifacts / "profile_export.jsonl").read_text().splitlines()]
    assert len(records) == NUM_REQUESTS
    assert [r.get("error") for r in records] == [None] * NUM_REQUESTS
    assert not any(r["metadata"]["was_cancelled"] for r in records)
    # at --eos-rate 0.2 a plain request would end early: ignore_eos makes each run to its budget
    assert [r["metrics"]["usage_completion_tokens"]["value"] for r in records] == [OUTPUT_TOKENS] * NUM_REQUESTS
    assert all(r["metrics"]["time_to_first_token"]["value"] > 0 for r in records)
    summary = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    assert summary["error_summary"] == [] and summary["request_count"]["avg"] == NUM_REQUESTS
    assert not summary["was_cancelled"]


def test_plain_requests_end_early_on_this_server():
    """The control for the budget check above: without ignore_eos the same server ends replies on EOS."""
    import httpx

    with serve("--decode-ms", "1", "--round-ms", "4", "--eos-rate", "0.2") as served:
        lengths = [httpx.post(f"{served.url}/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": f"control {i}"}], "max_completion_tokens": OUTPUT_TOKENS,
            "temperature": 0}).json()["usage"]["completion_tokens"] for i in range(NUM_REQUESTS)]
    assert min(lengths) < OUTPUT_TOKENS


def profile(url: str, artifacts: Path, tokenizer: Path, tmp_path: Path, *, classic: bool) -> subprocess.Popen:
    """One aiperf profile in the background: classic requests (speculative: false) or speculative ones."""
    osl = 96 if classic else 64
    command = [*aiperf_command(), "profile", "--model", "coopsched-mock", "--url", url, "--endpoint-type", "chat",
               "--streaming", "--request-count", "4" if classic else "6", "--concurrency", "1", "--isl", "16",
               "--osl", str(osl), "--tokenizer", str(tokenizer), "--random-seed", "0", "--ui", "none",
               "--no-server-metrics", "--no-gpu-telemetry", "--use-server-token-count",
               "--artifact-dir", str(artifacts), "--extra-inputs", "ignore_eos:true",
               "--extra-inputs", f"min_tokens:{osl}", "--extra-inputs", f"speculative:{str(not classic).lower()}"]
    return subprocess.Popen(command, cwd=tmp_path, env=aiperf_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


@pytest.mark.parametrize("mode, passes", [("slice", True), ("burst", False)])
def test_judge_on_aiperf_exports_of_a_mixed_run(tmp_path, mode, passes):
    """A classic aiperf run beside a speculative one: `coopsched judge` on the classic run's
    profile_export.jsonl passes at itl_ms=200 in slice mode and fails under the legacy burst."""
    from coopsched.cli import main as coopsched

    tokenizer = local_tokenizer(tmp_path / "tokenizer")
    env = {**clean_env(), "MLXCEL_MTP_TICK_SLICE": "1" if mode == "slice" else "0"}
    with serve("--decode-ms", "5", "--round-ms", "30", env=env) as served:
        runs = [profile(served.url, tmp_path / kind, tokenizer, tmp_path, classic=kind == "classic")
                for kind in ("classic", "spec")]
        assert [r.wait(timeout=300) for r in runs] == [0, 0]
    export = tmp_path / "classic" / "profile_export.jsonl"
    verdict_path = tmp_path / "verdict.json"
    code = coopsched(["judge", str(export), "--slo", "itl_ms=200", "--attainment", "1", "--json", str(verdict_path)])
    verdict = json.loads(verdict_path.read_text())
    assert verdict["requests"] == 4
    assert (code == 0) is passes and (verdict["slo_attainment"] == 1.0) is passes, verdict
