"""`coopsched sweep --target URL`: a concurrency ladder against a live `coopsched serve`, each rung
a real-time closed loop with the server's /metrics deltas (rounds and slices per rung)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from e2e_servers import serve
from factories import LADDER

from coopsched.cli import main as cli

pytestmark = pytest.mark.e2e


@pytest.fixture
def ladder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the sweep stores reports/sweeps/latest.json here
    path = tmp_path / "ladder.toml"
    path.write_text(LADDER)
    return path


@pytest.mark.parallel  # /metrics deltas and points counted; sweep exits 0 whatever the SLO's attainment
def test_a_concurrency_ladder_fills_metrics_delta_per_rung(ladder, tmp_path, capsys):
    out = tmp_path / "ladder.json"
    with serve("--decode-ms", "2", "--round-ms", "8") as served:
        code = cli(["sweep", str(ladder), "--concurrency", "1,2,4", "--seeds", "1", "--slo", "itl_ms=500",
                    "--target", served.url, "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    sweep = json.loads(out.read_text())
    assert (sweep["clock"], sweep["load_kind"], sweep["target"]) == ("real", "concurrency", served.url)
    assert [(p["mode"], p["load"], p["requests"]) for p in sweep["points"]] == [
        ("slice", 1, 8), ("slice", 2, 8), ("slice", 4, 8)]  # the server's own mode
    for p in sweep["points"]:
        delta = p["metrics_delta"]
        assert delta["coopsched_time_to_first_token_seconds_count"] == 8  # this rung's requests, no warm-up
        assert delta["coopsched_spec_rounds_total"] > 0
        assert delta["coopsched_spec_slices_total"] >= delta["coopsched_spec_rounds_total"]
        assert delta["llamacpp:spec_decode_num_drafts_total"] == delta["coopsched_spec_rounds_total"]
        assert delta["coopsched_inter_token_latency_seconds_count"] == 8 * 23  # one sample per gap, labels summed
        assert not any(name.endswith(("_created", "_bucket")) for name in delta)
        assert "coopsched_requests_running" not in delta  # gauges are not deltas
    assert "rounds" in printed and "slices" in printed and "capacity" in printed
    rows = sweep["summary"]["slice"]
    assert [r["metrics_delta"]["coopsched_spec_rounds_total"] for r in rows] == [
        p["metrics_delta"]["coopsched_spec_rounds_total"] for p in sweep["points"]]


@pytest.mark.parallel  # the mode served, requests counted, the refusal's words
def test_an_open_loop_point_against_a_server_and_a_mode_it_does_not_run(ladder, tmp_path, capsys):
    ladder.write_text(LADDER.replace('arrival = "closed"\nconcurrency = 1', 'arrival = "poisson"\nrate_per_s = 5'))
    out = tmp_path / "rates.json"
    with serve("--decode-ms", "2", "--round-ms", "8", "--mode", "fused") as served:
        assert cli(["sweep", str(ladder), "--rates", "40", "--seeds", "1", "--target", served.url,
                    "--json", str(out)]) == 0
        (point,) = json.loads(out.read_text())["points"]
        assert point["mode"] == "fused" and point["metrics_delta"]["coopsched_time_to_first_token_seconds_count"] == 8
        capsys.readouterr()
        assert cli(["sweep", str(ladder), "--rates", "40", "--mode", "slice", "--target", served.url]) == 2
    line = capsys.readouterr().out.strip()
    assert line.startswith("error: --mode slice: the server at") and "runs fused" in line


@pytest.mark.parallel  # the refusal's words
def test_a_mode_against_a_server_that_reports_none_says_so(ladder, capsys):
    """A server whose /health has no `mode` is not said to run one."""
    fake = Path(__file__).with_name("multitoken_server.py")
    with serve(command=[sys.executable, str(fake)]) as served:
        assert cli(["sweep", str(ladder), "--concurrency", "1", "--mode", "slice", "--target", served.url]) == 2
    line = capsys.readouterr().out.strip()
    assert line.startswith("error: --mode slice: the server at") and "reports no mode" in line
    assert "says so" not in line


def test_verify_points_run_the_twins_points_live_and_record_its_error(ladder, tmp_path, capsys):
    """--cost beside --target sweeps the twin and runs two of its points on the server. The server's
    own profile is near at the light point (arrival-bound there); a twin whose steps all cost twice
    the server's predicts half its saturated throughput, so its recorded error there is the lower.
    Real time on shared cores: one live run of 16 requests varies by tens of percent, so only that."""
    ladder.write_text(LADDER.replace('arrival = "closed"\nconcurrency = 1', 'arrival = "poisson"\nrate_per_s = 5')
                      .replace("num_requests = 8", "num_requests = 16"))
    true = {"decode_ms": [[1, 4.0]], "round_ms": [[4, 16.0]], "prefill_per_token_ms": 0.05, "accept_prob": 0.6}
    doubled = {**true, "decode_ms": [[1, 8.0]], "round_ms": [[4, 32.0]]}
    profiles = {}
    for name, terms in (("true", true), ("doubled", doubled)):
        profiles[name] = tmp_path / f"{name}.json"
        profiles[name].write_text(json.dumps(terms))
    sweeps = {}
    with serve("--cost", str(profiles["true"])) as served:
        for name, path in profiles.items():
            out = tmp_path / f"{name}-sweep.json"
            assert cli(["sweep", str(ladder), "--rates", "10,40,160", "--seeds", "1", "--cost", str(path),
                        "--target", served.url, "--json", str(out)]) == 0
            sweeps[name] = json.loads(out.read_text())
    printed = capsys.readouterr().out
    sweep = sweeps["true"]
    assert (sweep["clock"], sweep["target"], sweep["cost_profile"]) == ("virtual", served.url, str(profiles["true"]))
    assert sweep["modes"] == ["burst", "slice", "fused", "cost"]  # the twin swept every mode
    assert list(sweep["verified"]) == ["slice@10", "slice@160"]  # the server's mode, lowest and highest load
    twin_points = {(p["mode"], p["load"]): p for p in sweep["points"] if p["seed"] == 0}
    for entry in sweep["verified"].values():
        rows = entry["metrics"]
        assert set(rows) == {"aggregate_tok_s", "ttft_p50_ms", "ttft_p95_ms", "classic_itl_p99_ms", "itl_p99_ms",
                             "slo_attainment"}
        assert rows["aggregate_tok_s"]["predicted"] == twin_points[("slice", entry["load"])]["aggregate_tok_s"]
        got = rows["aggregate_tok_s"]
        assert got["measured"] > 0 and got["error"] == round(got["predicted"] / got["measured"] - 1, 4)
    aggregate = lambda s, point: s["verified"][point]["metrics"]["aggregate_tok_s"]["error"]
    assert abs(aggregate(sweep, "slice@10")) < 0.5, printed
    assert aggregate(sweeps["doubled"], "slice@160") < aggregate(sweep, "slice@160"), printed
    assert "the twin vs" in printed and "slice@160" in printed
