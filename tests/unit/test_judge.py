"""`coopsched judge` and the SLO module: parsing, the per-token rule, every reader on fixtures, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coopsched.cli import main as coopsched
from harness.judge import cli as judge
from harness.run.slo import RequestTiming, Slo, SloError, evaluate, meets, parse_attainment, parse_slo

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "judge"


# -- --slo and --attainment ------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("itl_ms=50,ttft_ms=500", Slo(50.0, 500.0)),
    ("ttft_ms=500,itl_ms=50", Slo(50.0, 500.0)),
    ("itl_ms=50", Slo(50.0, None)),
    ("ttft_ms=.5", Slo(None, 0.5)),
    (" itl_ms = 12.5 , ttft_ms=+8 ", Slo(12.5, 8.0)),
], ids=["both", "either-order", "itl-only", "ttft-only", "spaces-and-signs"])
def test_parse_slo(text, expected):
    assert parse_slo(text) == expected


@pytest.mark.parametrize("text, says", [
    ("", "empty item"),
    ("itl_ms=50,", "empty item"),
    ("itl_ms", "no '='"),
    ("tpot_ms=5", "unknown; accepted: itl_ms, ttft_ms"),
    ("itl_ms=0", "number of ms > 0"),
    ("itl_ms=-3", "number of ms > 0"),
    ("itl_ms=fast", "number of ms > 0"),
    ("itl_ms=1e3", "number of ms > 0"),
    ("itl_ms=inf", "number of ms > 0"),
    ("itl_ms=50ms", "number of ms > 0"),
    ("itl_ms=5,itl_ms=6", "names itl_ms twice"),
], ids=["empty", "trailing-comma", "no-value", "unknown-key", "zero", "negative", "word", "exponent", "inf",
        "unit-suffix", "twice"])
def test_a_bad_slo_says_what_is_accepted(text, says):
    with pytest.raises(SloError, match="--slo") as info:
        parse_slo(text)
    assert says in str(info.value)


@pytest.mark.parametrize("text", ["1.5", "-0.1", "most", "nan"])
def test_a_bad_attainment_is_refused(text):
    with pytest.raises(SloError, match="between 0 and 1"):
        parse_attainment(text)


# -- the per-token rule ------------------------------------------------------------------------
SLO = Slo(itl_ms=50.0, ttft_ms=500.0)


@pytest.mark.parametrize("request_, is_met", [
    (RequestTiming("r", 100.0, (10.0, 10.0, 10.0)), True),
    (RequestTiming("r", 100.0, (1.0,) * 99 + (60.0,)), False),  # mean 1.6 ms, one stall: a miss
    (RequestTiming("r", 100.0, (0.0, 0.0, 50.0)), True),  # a multi-token arrival, then a gap at the limit
    (RequestTiming("r", 501.0, (10.0,)), False),
    (RequestTiming("r", 100.0, ()), True),  # one token: no gap to judge
    (RequestTiming("r", None, ()), False),
    (RequestTiming("r", 100.0, (10.0,), error="HTTP 500"), False),
], ids=["smooth", "one-stall-among-fast-gaps", "zeros-inside-an-arrival", "slow-ttft", "single-token",
        "no-token", "failed"])
def test_a_request_meets_the_slo_iff_ttft_and_every_gap_hold(request_, is_met):
    assert meets(SLO, request_) is is_met


def test_evaluate_names_the_worst_gaps_and_counts_every_request():
    requests = [RequestTiming("a", 10.0, (5.0, 70.0)), RequestTiming("b", 10.0, (0.0, 0.0, 20.0)),
                RequestTiming("c", None, (), error="refused")]
    out = evaluate(SLO, requests)
    assert (out["requests"], out["met"], out["slo_attainment"], out["failed_requests"]) == (3, 1, 1 / 3, 1)
    assert out["worst_gaps"][0] == {"request": "a", "gap_ms": 70.0, "after_token": 2}
    assert out["gap_ms"]["max"] == 70.0 and out["gap_samples"] == 5 and out["arrival_gap_ms"]["p50"] == 20.0
    assert [m["request"] for m in out["misses"]] == ["a", "c"] and "gap 70.0 > 50" in out["misses"][0]["reason"]


# -- readers -------------------------------------------------------------------------------------
def test_aiperf_records_in_their_units_with_chunks_as_arrivals():
    fmt, requests, left_out = judge.load(FIXTURES / "aiperf_profile_export.jsonl")
    by_id = {r.id: r for r in requests}
    assert fmt == "aiperf" and left_out == 1 and "req-warmup" not in by_id  # the warm-up record is skipped
    assert by_id["req-smooth"].ttft_ms == 120.0
    assert by_id["req-smooth"].gaps_ms == (20.0, 22.0, 25.0, 0.0, 0.0)  # 6 tokens in 4 chunks: 2 zero gaps
    assert by_id["req-in-ns"].ttft_ms == pytest.approx(100.0)
    assert by_id["req-in-ns"].gaps_ms == pytest.approx((30.0, 45.0))
    assert by_id["req-failed"].error == "Server encountered an internal error"
    out = evaluate(Slo(itl_ms=200.0, ttft_ms=500.0), requests)
    assert out["met"] == 2 and out["slo_attainment"] == pytest.approx(0.4)
    assert {m["request"] for m in out["misses"]} == {"req-stall", "req-slow-start", "req-failed"}


def test_a_trace_is_judged_per_request_and_per_run():
    fmt, requests, _ = judge.load(FIXTURES / "trace.json")
    assert fmt == "trace" and [r.id for r in requests][:2] == ["handmade/slice/classic", "handmade/slice/spec"]
    spec = requests[1]
    assert spec.ttft_ms == 20.0 and spec.gaps_ms == (0.0, 0.0, 30.0, 0.0)
    v = judge.verdict(Path("trace.json"), fmt, requests, 0, Slo(itl_ms=100.0), 0.9)
    assert v["slo_attainment"] == 0.75 and not v["ok"]
    assert v["groups"] == {"handmade/burst": {"requests": 2, "slo_attainment": 0.5},
                           "handmade/slice": {"requests": 2, "slo_attainment": 1.0}}


def test_a_locust_report_leaves_out_requests_the_run_end_cut():
    fmt, requests, left_out = judge.load(FIXTURES / "locust_report.json")
    assert fmt == "locust" and left_out == 1 and [r.id for r in requests] == ["classic-0", "spec-1", "spec-2"]
    assert requests[1].ttft_ms == 15.0 and requests[1].gaps_ms == (0.0, 0.0, 35.0)
    assert evaluate(Slo(itl_ms=50.0), requests)["slo_attainment"] == pytest.approx(2 / 3)  # spec-2 failed


@pytest.mark.parametrize("name, says", [
    ("guidellm_benchmarks.json", "guidellm's output keeps only the first and last token time"),
    ("aiperf_summary.json", "judge the per-request profile_export.jsonl"),
], ids=["guidellm", "aiperf-summary"])
def test_formats_without_per_gap_timings_are_refused_with_the_reason(name, says):
    with pytest.raises(judge.FormatError, match=says):
        judge.load(FIXTURES / name)


def test_an_old_locust_report_without_per_request_timings_is_refused(tmp_path):
    report = json.loads((FIXTURES / "locust_report.json").read_text())
    del report["per_request"]
    (tmp_path / "old.json").write_text(json.dumps(report))
    with pytest.raises(judge.FormatError, match="no per-request timings"):
        judge.load(tmp_path / "old.json")


def test_an_explicit_format_that_does_not_fit_is_refused():
    with pytest.raises(judge.FormatError, match="not a coopsched trace"):
        judge.load(FIXTURES / "locust_report.json", "trace")


# -- the command ------------------------------------------------------------------------------------
def test_exit_0_iff_the_attainment_is_reached(tmp_path, capsys):
    path = FIXTURES / "aiperf_profile_export.jsonl"
    out = tmp_path / "verdict.json"
    assert coopsched(["judge", str(path), "--slo", "itl_ms=200,ttft_ms=500", "--attainment", "0.4",
                      "--json", str(out)]) == 0
    verdict = json.loads(out.read_text())
    assert (verdict["requests"], verdict["slo_attainment"], verdict["format"]) == (5, 0.4, "aiperf")
    assert verdict["worst_gaps"][0] == {"request": "req-stall", "gap_ms": 450.0, "after_token": 2}
    assert set(verdict["gap_ms"]) == {"p50", "p90", "p99", "max"}
    assert coopsched(["judge", str(path), "--slo", "itl_ms=200,ttft_ms=500"]) == 1  # default target 0.9
    assert "attainment 0.400 (target 0.9) -> FAIL" in capsys.readouterr().out


@pytest.mark.parametrize("content", [None, b"", b"\xff\xfe\x00binary", b"just words\n", b'{"some": "json"}',
                                     b'{"a": 1}\n{"b": 2}\n', b"[]"],
                         ids=["missing", "empty", "binary", "text", "unknown-json", "unknown-jsonl", "empty-list"])
def test_an_unreadable_or_unknown_file_is_one_line_naming_it_and_exit_2(tmp_path, capsys, content):
    path = tmp_path / "results.json"
    if content is not None:
        path.write_bytes(content)
    assert coopsched(["judge", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: ") and "accepted: aiperf" in err


def test_a_directory_is_refused_with_exit_2(tmp_path, capsys):
    assert coopsched(["judge", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {tmp_path}: ")


def test_a_bad_slo_on_the_command_line_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        coopsched(["judge", str(FIXTURES / "trace.json"), "--slo", "itl=5"])
    assert info.value.code == 2
    assert "--slo key 'itl' is unknown; accepted: itl_ms, ttft_ms" in capsys.readouterr().err
