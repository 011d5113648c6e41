"""llama.cpp's llama-server on loopback, without and with a draft model: the tiny model exported as
GGUF, greedy parity with the MLX backend, and every live tool against it (--target, locust, judge,
a concurrency sweep, calibrate --target with --report).

`tox -e llamacpp` builds llama-server from the registry's sdist (tools/build_llama_server.py) and
points LLAMA_SERVER_CACHE at it; elsewhere these tests are skipped. The server gets one core
(`taskset`, `-t 1`) and the clients the others. With a draft model llama-server speculates for
every slot, `speculative: false` or not; it streams one token per SSE event (text only: tokens
are counted from usage.completion_tokens), so rounds are seen only by timing.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import pytest
from e2e_servers import clean_env
from factories import LADDER
from interop_runs import SERVER_CPU, Results, assert_every_token_counted, coopsched, locust_run, on_cpus, target_run

from coopsched import cli
from harness.live import client
from harness.live.client import free_port, spawn_server

pytestmark = pytest.mark.llamacpp

RUNS = 3
STARTUP_S = 120  # ~40 ms on a quiet machine
SERVER_ARGS = ("--host", "127.0.0.1", "--parallel", "4", "-c", "4096", "-t", "1", "--metrics")
# `-md` alone loads a draft model but drafts nothing: the speculation type turns it on
CONFIGS = {"no-draft": (), "draft": ("-md", "{draft}", "--spec-type", "draft-simple", "--spec-draft-n-max", "3")}
RESULTS = Results(Path(os.environ.get("COOPSCHED_LLAMACPP_RESULTS", "reports/llamacpp/latest.json")))
NUM_PROMPTS, PARITY_TOKENS = 6, 32


def server_binary() -> Path:
    cache = os.environ.get("LLAMA_SERVER_CACHE")
    if not cache:
        pytest.skip("LLAMA_SERVER_CACHE is not set: `tox -e llamacpp` builds llama-server and sets it")
    unavailable = Path(cache) / "unavailable.txt"
    if unavailable.exists():
        pytest.skip(unavailable.read_text().strip())
    binary = Path(cache) / "build" / "bin" / "llama-server"
    if not binary.is_file():
        pytest.fail(f"{binary} is missing: `python tools/build_llama_server.py --cache {cache}` builds it")
    return binary


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(target dir, target.gguf, draft.gguf): the tiny pair `model build` makes, exported by the CLI."""
    pytest.importorskip("gguf")
    pytest.importorskip("mlx_lm")
    from coopsched.backends.model_build import ensure_tiny_models

    target, draft = ensure_tiny_models()
    out = tmp_path_factory.mktemp("gguf")
    for name, source in (("target", target), ("draft", draft)):
        assert cli.main(["model", "export", "--format", "gguf", "--out", str(out / f"{name}.gguf"),
                         "--from", str(source)]) == 0
    return target, out / "target.gguf", out / "draft.gguf"


def start(target_gguf: Path, extra: tuple[str, ...] = ()):
    port = free_port()
    command = [str(server_binary()), "-m", str(target_gguf), "--port", str(port), *SERVER_ARGS, *extra]
    return spawn_server(command=on_cpus(SERVER_CPU, command), port=port, env=clean_env(), timeout_s=STARTUP_S)


@pytest.fixture(scope="module", params=list(CONFIGS))
def llama(request, models):
    _, target, draft = models
    extra = tuple(a.replace("{draft}", str(draft)) for a in CONFIGS[request.param])
    began = time.monotonic()
    with start(target, extra) as served:
        RESULTS.record(request.param, "startup_s", round(time.monotonic() - began, 3))
        yield request.param, served.url


# -- greedy parity ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prompts():
    from coopsched.backends import model_build

    suppressed = set(model_build.suppressed_ids(model_build.build_tokenizer()))
    printable = [i for i in range(model_build.VOCAB_SIZE) if i not in suppressed]
    rng = random.Random(0)
    return [[rng.choice(printable) for _ in range(rng.randint(3, 24))] for _ in range(NUM_PROMPTS)]


@pytest.fixture(scope="module")
def mlx_greedy(models, prompts):
    """The MLX backend's greedy tokens for each prompt (classic rows, one batch)."""
    from coopsched.backends.mlx_backend import MlxBackend
    from coopsched.clock import RealClock
    from coopsched.core import Request, Scheduler, SchedulerConfig
    from coopsched.engine import Engine

    target, _, _ = models
    requests = [Request(f"p{i}", tuple(p), PARITY_TOKENS, speculative=False) for i, p in enumerate(prompts)]
    Engine(Scheduler(SchedulerConfig(block_size=4)), MlxBackend(target), RealClock()).run(requests)
    return [list(r.output_token_ids) for r in requests]


def greedy(url: str, prompt: list[int]) -> list[int]:
    """llama-server's greedy tokens for a prompt given as token ids (its native /completion)."""
    status, body = client.request(url, "POST", "/completion", {
        "prompt": prompt, "n_predict": PARITY_TOKENS, "temperature": 0.0, "cache_prompt": False,
        "return_tokens": True, "ignore_eos": True}, timeout_s=120)
    assert status == 200, body[:300]
    return json.loads(body)["tokens"]


def greedy_together(url: str, prompts: list[list[int]]) -> list[list[int]]:
    outs: list = [None] * len(prompts)
    threads = [threading.Thread(target=lambda i=i: outs.__setitem__(i, greedy(url, prompts[i]))) for i in
               range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    return outs


def test_greedy_over_llama_server_equals_the_mlx_backend_alone_and_together(llama, prompts, mlx_greedy):
    config, url = llama
    alone = [greedy(url, p) for p in prompts]
    together = greedy_together(url, prompts)
    RESULTS.record(config, "greedy_parity", {"alone_equals_mlx": sum(a == m for a, m in zip(alone, mlx_greedy)),
                                             "together_equals_alone": sum(t == a for t, a in zip(together, alone)),
                                             "prompts": len(prompts)})
    assert alone == mlx_greedy
    assert together == alone


def test_llama_server_tokenizes_text_as_the_tokenizer_json_does(llama, models):
    from tokenizers import Tokenizer

    target, _, _ = models
    tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
    rng = random.Random(1)
    texts = ["The classic row.", "Speculate, then verify.", "  two  spaces, tabs\tand 1234 digits!",
             *("".join(chr(rng.randrange(32, 127)) for _ in range(40)) for _ in range(4))]
    for text in texts:
        status, body = client.request(llama[1], "POST", "/tokenize", {"content": text})
        assert status == 200 and json.loads(body)["tokens"] == tokenizer.encode(text).ids, text


def test_without_the_q_k_permutation_greedy_output_differs(models, prompts, mlx_greedy, tmp_path, monkeypatch):
    """The permutation is what makes llama.cpp's rotary embedding compute mlx-lm's: leave it out and
    greedy decoding goes elsewhere (the export test's planted regression)."""
    from coopsched.backends import gguf_export

    monkeypatch.setattr(gguf_export, "permute_for_rope", lambda weights, _heads: weights)
    unpermuted = gguf_export.export_gguf(models[0], tmp_path / "unpermuted.gguf")
    with start(unpermuted) as served:
        outs = [greedy(served.url, p) for p in prompts]
    assert sum(o != m for o, m in zip(outs, mlx_greedy)) >= NUM_PROMPTS // 2


# -- the live tools --------------------------------------------------------------------------
def target_figures(url: str, tmp_path: Path) -> dict:
    figures, checks = target_run(url, tmp_path)
    return {**figures, "checks": {n: {"ok": c["ok"], "value": c["value"], "bound": c["bound"],
                                      "note": c["note"][:300]} for n, c in checks.items()},
            "failed": [n for n, c in checks.items() if c["ok"] is False]}


def test_target_and_locust_count_every_token_and_agree(llama, tmp_path):
    config, url = llama
    targets = [target_figures(url, tmp_path) for _ in range(RUNS)]
    RESULTS.record(config, "target", targets)
    locusts, judged = [], []
    for _ in range(RUNS):
        run, _, report_path = locust_run(url, tmp_path)
        locusts.append(run)
        verdict_path = tmp_path / "verdict.json"
        proc = coopsched("judge", str(report_path), "--json", str(verdict_path), cwd=tmp_path)
        verdict = json.loads(verdict_path.read_text())
        judged.append({"exit": proc.returncode, "format": verdict["format"], "requests": verdict["requests"],
                       "finished": sum(map(len, run["finished"].values())), "groups": sorted(verdict["groups"])})
    RESULTS.record(config, "locust", locusts)
    RESULTS.record(config, "judge", judged)
    assert_every_token_counted(targets, locusts)  # counted from usage.completion_tokens
    for r in locusts:
        assert r["finished"]["classic"], r
    for j in judged:
        assert j["exit"] in (0, 1) and j["format"] == "locust" and j["requests"] == j["finished"], j
    verdicts = {t["verdict"] for t in targets} | {r["verdict"] for r in locusts}
    assert len(verdicts) == 1, ([t["verdict"] for t in targets], [r["verdict"] for r in locusts])


def test_a_concurrency_sweep_counts_llama_cpp_tokens_per_rung(llama, tmp_path, capsys):
    config, url = llama
    ladder, out = tmp_path / "ladder.toml", tmp_path / "sweep.json"
    ladder.write_text(LADDER)
    proc = coopsched("sweep", str(ladder), "--target", url, "--concurrency", "1,2,4", "--seeds", "1",
                     "--json", str(out), cwd=tmp_path)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    points = json.loads(out.read_text())["points"]
    keep = ("load", "requests", "slo_attainment", "itl_p99_ms", "aggregate_tok_s", "spec_tok_s", "ttft_p95_ms")
    RESULTS.record(config, "sweep", {"points": [{**{k: p.get(k) for k in keep}, "llamacpp": {
        k: v for k, v in (p.get("metrics_delta") or {}).items() if k.startswith("llamacpp:")}} for p in points],
        "table": proc.stdout})
    with capsys.disabled():
        print(f"\n-- sweep --concurrency 1,2,4 --target ({config}) --\n{proc.stdout}")
    assert [(p["mode"], p["load"], p["requests"]) for p in points] == [("external", c, 8) for c in (1, 2, 4)]
    for p in points:
        delta = p["metrics_delta"]
        assert delta["llamacpp:tokens_predicted_total"] == 8 * 24, delta  # this rung's tokens, no warm-up
        drafts = delta["llamacpp:spec_decode_num_drafts_total"]
        assert (drafts > 0) if config == "draft" else (drafts == 0), delta
        assert delta["llamacpp:spec_decode_num_accepted_tokens_total"] <= \
            delta["llamacpp:spec_decode_num_draft_tokens_total"], delta
    assert ("drafts" in proc.stdout) and ("accepted" in proc.stdout), proc.stdout


@pytest.fixture(scope="module")
def calibrated(llama, tmp_path_factory):
    """`calibrate --target URL --out P --report R` once per config: (config, stdout, profile, report)."""
    config, url = llama
    work = tmp_path_factory.mktemp(f"calibrate-{config}")
    profile_path, report_path = work / "profile.json", work / "report.json"
    proc = coopsched("calibrate", "--target", url, "--out", str(profile_path), "--report", str(report_path),
                     "--max-batch", "4", "--report-runs", "3", cwd=work)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and profile_path.exists() and report_path.exists(), output[-4000:]
    profile, report = json.loads(profile_path.read_text()), json.loads(report_path.read_text())
    RESULTS.record(config, "calibrate", {"profile": {k: v for k, v in profile.items() if k != "jitter_quantiles"},
                                         "report": report, "output": proc.stdout})
    return config, proc.stdout, profile, report


def test_calibrate_writes_a_profile_and_its_report(calibrated, capsys):
    config, stdout, profile, report = calibrated
    fit = profile["calibrated"]["fit"]
    with capsys.disabled():  # the fit and the --report tables, in the tox log
        print(f"\n-- calibrate --target --report ({config}) --\n{stdout}")
    assert profile["calibrated"]["context"] == "/v1/models meta.n_ctx = 1024"  # 4096 over 4 slots
    assert profile["decode_ms"] and profile["prefill_per_token_ms"] >= 0, stdout
    if config == "no-draft":
        assert fit["speculates"] is False and profile["round_ms"] is None and profile["accept_prob"] is None
        assert "counted no draft tokens" in fit["unfitted"]["accept_prob"], fit["unfitted"]
        assert "not fitted: round_ms" in " ".join(stdout.split())
    else:
        assert fit["speculates"] is True and fit["unfitted"] == {}, fit
        assert fit["server_drafts"]["draft_tokens"] > 0 and 0 < profile["accept_prob"] < 1, fit
    assert "the twin vs" in stdout and report["speculates"] is (config == "draft")


# -- the twin: llama.cpp's scheduler at the calibrated costs ------------------------------------
def test_the_twin_is_llama_cpps_and_predicts_a_held_out_workload(calibrated):
    """Detected as llama.cpp, its server params as started; on the report's held-out light and knee
    workloads (3 live runs each) aggregate tokens/s within the rule (10%, or 1.5x the live spread);
    and with a draft model the twin drafts as often as the server's /metrics counted, where
    coopsched's own scheduler (the cost-only twin beside it) speculates only the speculative half."""
    config, stdout, profile, report = calibrated
    assert profile["server"] == report["server"] == "llama.cpp", report["server_evidence"]
    params = profile["server_params"]
    assert params["parallel"] == 4 and params["draft_model"] is (config == "draft"), params
    if config == "draft":
        assert params["spec_draft_n_max"] == 3, params
    workloads = report["heldout"]["workloads"]
    RESULTS.record(config, "twin", {"params": params, "heldout": report["heldout"]})
    for name, w in workloads.items():
        assert w["rows"]["aggregate_tok_s"]["pass"] is True, (name, w["rows"]["aggregate_tok_s"], stdout[-3000:])
        books = w["books"]  # llama-server's own books: every run scraped, every twin counted
        assert set(books) == {"live", "twin", "before"} and books["live"]["steps"] > 0, books
        if config == "draft":
            live_drafts = books["live"]["drafts"]
            assert abs(books["twin"]["drafts"] / live_drafts - 1) <= 0.15, (name, books)
            assert books["before"]["drafts"] < 0.75 * live_drafts, (name, books)  # the twin before misses it
        else:
            assert books["live"]["drafts"] == books["twin"]["drafts"] == 0, (name, books)
