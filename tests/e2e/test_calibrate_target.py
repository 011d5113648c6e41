"""`coopsched calibrate --target URL`: a digital twin of a server from its token timings alone.

Against `coopsched serve --backend mock` with known costs the calibration recovers them (decode step,
round, the drafter's acceptance), and (marker `twins`, `tox -e twins`: minutes of wall time) the
workload simulated on the profile predicts the live server;
against a fake that sends a round's tokens in one event (as vLLM does) rounds come from the events.
Real time on a shared machine: the load average goes into the failure message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_servers import clean_env, serve

from harness.calibrate import heldout
from harness.calibrate.fit import acceptance_from_tokens

pytestmark = pytest.mark.e2e

DECODE_MS, ROUND_MS, ACCEPT = 7.0, 42.0, 0.6


def calibrate(url: str, tmp_path: Path, *args: str) -> tuple[dict, dict | None, str]:
    profile, report = tmp_path / "profile.json", tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "coopsched.cli", "calibrate", "--target", url,
                           "--out", str(profile), *args], capture_output=True, text=True, timeout=300,
                          env=clean_env(), cwd=tmp_path)
    output = f"{proc.stdout}{proc.stderr}\nload average {os.getloadavg()}"
    assert proc.returncode == 0, output
    return (json.loads(profile.read_text()), json.loads(report.read_text()) if report.exists() else None, output)


def test_a_mock_server_is_recovered(tmp_path):
    with serve("--decode-ms", str(DECODE_MS), "--round-ms", str(ROUND_MS), "--accept-prob", str(ACCEPT)) as served:
        profile, _, output = calibrate(served.url, tmp_path)
    for batch, ms in profile["decode_ms"]:
        # with many streams the server really is slower than its 7 ms sleep: each tick also hands
        # B events to the event loop, on 2 shared cores (measured +6% at B = 1-2, up to +18% at B = 8)
        assert ms == pytest.approx(DECODE_MS, rel=0.15 if batch <= 2 else 0.25), (batch, output)
    assert profile["round_ms"] == [[4, pytest.approx(ROUND_MS, rel=0.15)]], output
    assert profile["accept_prob"] == pytest.approx(ACCEPT, abs=0.1), output
    assert profile["calibrated"]["mode"] == "slice" and profile["switch_ms"] < 2.0, output
    assert set(profile["jitter_quantiles"]) >= {"decode", "verify", "prefill"}
    assert "residual" in output and profile["server"] == "coopsched"
    # acceptance, the round, decode and the prefill are the server's own books (round counts, tick
    # wall times): the mock prefills at 0.2 ms a token from 0; the HTTP layer is the frontend's
    assert set(profile["calibrated"]["replaced"]) == {"accept_prob", "round_ms", "verify_ms", "decode_ms",
                                                      "prefill_fixed_ms", "prefill_per_token_ms",
                                                      "draft_prefill_per_token_ms"}, output
    assert "coopsched: accept_prob" in output and "round ticks of" in output, output
    assert profile["prefill_per_token_ms"] == pytest.approx(0.2, rel=0.2) and profile["prefill_fixed_ms"] < 2.0, output
    params = profile["server_params"]
    assert set(params) == {"frontend_ms", "frontend_stall_ms"} and 0 <= params["frontend_ms"] < 20, output
    # the mock's ticks sleep: its HTTP layer takes no core from them, so an arrival stalls a stream by
    # little beyond its admit tick
    assert 0 <= params["frontend_stall_ms"] < 5, output


@pytest.mark.twins  # ~2 min of wall time: tox -e twins
def test_the_mock_servers_twin_predicts_it(tmp_path):
    with serve("--decode-ms", str(DECODE_MS), "--round-ms", str(ROUND_MS), "--accept-prob", str(ACCEPT)) as served:
        # a 500 ms TTFT bound keeps the capacity search's rungs short (arrivals over 2 s) and two of them
        _, report, output = calibrate(served.url, tmp_path, "--report", str(tmp_path / "report.json"),
                                      "--report-runs", "3", "--heldout-requests", "8", "--slo", "ttft_ms=500",
                                      "--capacity-rungs", "2")
    rows = report["modes"]["slice"]
    for metric in ("classic_itl_mean_ms", "spec_itl_mean_ms"):
        assert abs(rows[metric]["error"]) <= 0.25, (metric, rows[metric], output)
    assert abs(rows["aggregate_tok_s"]["error"]) <= 0.20, (rows["aggregate_tok_s"], output)
    assert "the twin vs" in output and report["server"] == "coopsched"
    held = report["heldout"]
    assert list(held["workloads"]) == ["light", "knee"] and held["knee_rate_per_s"] > held["workloads"]["light"][
        "rate_per_s"]
    for workload in held["workloads"].values():
        assert set(workload["rows"]) == {"aggregate_tok_s", "ttft_p50_ms", "ttft_p95_ms", "itl_mean_ms",
                                         "classic_itl_p99_ms"}
        assert all(len(r["runs"]) == heldout.LIVE_RUNS and r["pass"] is not None for r in workload["rows"].values())
    # arrival-bound at the light rate: the one figure a real-time run of 8 requests pins down
    assert held["workloads"]["light"]["rows"]["aggregate_tok_s"]["pass"] is True, output
    assert "held-out workloads" in output and "PASS" in output
    cap = held["capacity"]  # searched from the ladder's capacity: one line a rung as it ran
    assert 1 <= len(cap["search"]) <= 2 and all(s["requests"] >= 8 for s in cap["search"]), cap
    assert cap["top_rate_is_a_bound"] is (cap["missed"] is None) and "capacity rung 1/2" in output, cap


@pytest.mark.parallel  # the kind and the words said, never a fitted figure
def test_the_kind_is_detected_and_an_override_says_what_it_replaced(tmp_path):
    with serve("--decode-ms", "1", "--round-ms", "4") as served:
        profile, _, output = calibrate(served.url, tmp_path, "--repeats", "1", "--max-batch", "1",
                                       "--server", "unknown")
    assert profile["server"] == "unknown"
    assert profile["calibrated"]["server_evidence"].startswith("--server unknown (detected coopsched: /health")
    assert "twin runs coopsched's own scheduler" in " ".join(output.split())


@pytest.mark.parametrize("stream_kind", ["token-ids", "text-and-usage"])
def test_rounds_sent_as_one_event_each(tmp_path, stream_kind):
    """A fake that streams 3 tokens per speculative event every 12 ms and one classic token every
    5 ms, and says nothing about itself: 3 tokens per round is an acceptance, 12 ms a round."""
    fake = Path(__file__).parents[1] / "e2e" / "multitoken_server.py"
    args = ["--tokens-per-event", "3"] + (["--text-only"] if stream_kind == "text-and-usage" else [])
    with serve(command=[sys.executable, str(fake), *args]) as served:
        profile, _, output = calibrate(served.url, tmp_path, "--repeats", "2", "--max-batch", "4")
    fit = profile["calibrated"]["fit"]
    # real time on a shared CPU: a late event can land in the next round's group now and then
    assert fit["rounds"]["tokens_per_round"] == pytest.approx(3.0, abs=0.25), output
    assert profile["accept_prob"] == pytest.approx(acceptance_from_tokens(3.0, 4), abs=0.05)
    assert profile["round_ms"][0][1] == pytest.approx(12.0, rel=0.15), output
    assert profile["decode_ms"][0][1] == pytest.approx(5.0, rel=0.15), output
    assert profile["calibrated"]["mode"] is None and fit["classic_streams_in_rounds"] == 0


def test_a_server_that_never_speculates_gets_its_classic_terms_and_the_rest_named(tmp_path):
    """The fake with one token per event: its speculative requests stream like classic ones, so
    prefill and decode are fitted, every speculative term is named unfitted, and the twin serves
    every request classically; the fake reports no context size, which is said."""
    fake = Path(__file__).parents[1] / "e2e" / "multitoken_server.py"
    with serve(command=[sys.executable, str(fake), "--tokens-per-event", "1"]) as served:
        profile, report, output = calibrate(served.url, tmp_path, "--repeats", "2", "--max-batch", "2",
                                            "--report", str(tmp_path / "report.json"), "--report-runs", "2",
                                            "--heldout-requests", "6", "--capacity-rungs", "0")
    fit = profile["calibrated"]["fit"]
    assert fit["speculates"] is False and fit["unfitted"]["accept_prob"].startswith("no speculative rounds"), output
    assert profile["round_ms"] is None and profile["accept_prob"] is None and profile["verify_ms"] == [
        [1, profile["decode_ms"][0][1]]]
    # the fake sleeps 5 ms per token, so no decode step is faster; a loaded machine makes them slower
    assert profile["decode_ms"][0][1] >= 0.9 * 5.0, output
    assert "reported no context size" in profile["calibrated"]["context"]
    assert "not fitted: round_ms" in " ".join(output.split()) and "reported no context size" in output
    assert report["speculates"] is False and report["modes"]["slice"]["spec_tok_s"]["measured"] is None
    assert profile["server"] == "unknown" and "no rule matched" in profile["calibrated"]["server_evidence"]
    assert "heldout" in report and "twin runs coopsched's own scheduler" in " ".join(output.split())


def test_a_burst_servers_books_give_its_acceptance_but_no_round_price():
    """The legacy burst runs a request's rounds in one tick: the books hold no one-row round tick to
    price a round from, and the fitter keeps the timing fit's round and says why; the responses'
    round counts still give the acceptance."""
    from harness.calibrate.server_params.coopsched import round_books
    from harness.calibrate.target import Server

    with serve("--mode", "burst", "--decode-ms", "1", "--round-ms", "4", "--accept-prob", str(ACCEPT)) as served:
        costs, said = round_books(Server.connect(served.url), 4, probes=6)
    assert set(costs) == {"accept_prob"} and costs["accept_prob"] == pytest.approx(ACCEPT, abs=0.12), said
    assert any("a burst's rounds sharing one tick" in line for line in said), said
