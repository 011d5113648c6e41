"""The prefill-grant scenario: the grant interval trades a long prompt's TTFT against how many of the
classic rows' gaps hold a chunk; its bounds (prefill_grant, mixed_step) fail on what they guard against."""

from __future__ import annotations

import itertools

import pytest

import coopsched.core.scheduler as scheduler_module
from coopsched.core import upstream_rule
from coopsched.core.prefill import Budget
from harness.run import runner, scenario


def run(mode: str = "slice", **options) -> dict:
    return runner.run_scenario(scenario.load("prefill-grant"), mode, options=options)


def checks(trace: dict) -> dict:
    return {c["name"]: c for c in trace["checks"]}


def long_ttft(trace: dict) -> float:
    long = next(r for r in trace["requests"] if r["id"] == "long")
    return long["token_times_ms"][0] - long["arrival_ms"]


def gaps_with_a_chunk(trace: dict) -> int:
    """Classic gaps (c0's) that hold a chunk of the long prompt."""
    chunks = [t for t in trace["ticks"] if t["detail"] == "chunk" and t["request_ids"] == ["long"]]
    times = next(r for r in trace["requests"] if r["id"] == "c0")["token_times_ms"]
    return sum(any(a < t["end_ms"] <= b for t in chunks) for a, b in itertools.pairwise(times))


def test_a_longer_interval_delays_the_long_prompt_and_spares_the_rows_gaps():
    traces = {n: run(prefill_grant_interval=n) for n in (1, 4, 16)}
    assert all(c["ok"] for t in traces.values() for c in t["checks"])
    ttft = [long_ttft(traces[n]) for n in (1, 4, 16)]
    assert ttft[0] < ttft[1] < ttft[2]
    stalled = [gaps_with_a_chunk(traces[n]) for n in (1, 4, 16)]
    assert stalled == [8, 8, 8]  # 2,000 tokens in 256-token chunks: each chunk in its own gap
    grants = [sum(t["detail"] == "chunk" for t in traces[n]["ticks"]) for n in (1, 4, 16)]
    assert grants == [8, 8, 8]


def test_the_grant_bound_fails_when_the_grant_never_fires(monkeypatch):
    assert checks(run())["prefill_grant"]["ok"]
    monkeypatch.setattr(upstream_rule, "grant_due", lambda state: False)
    check = checks(run())["prefill_grant"]
    assert check["holds"] is False and check["value"] > check["bound"]


def test_interval_zero_has_no_grant_bound():
    check = checks(run(prefill_grant_interval=0))["prefill_grant"]
    assert check["skipped"] and "interval 0" in check["note"]


def test_a_gap_holds_one_mixed_step_and_a_whole_prompt_prefill_fails_it(monkeypatch):
    trace = run(mixed_step=True)
    assert any(t["action"] == "mixed" for t in trace["ticks"]) and all(c["ok"] for c in trace["checks"])
    mixed = checks(trace)["mixed_step"]
    assert mixed["holds"] and mixed["value"] == pytest.approx(mixed["bound"])  # S + M, exactly
    # the mixed step planned with no chunk budget: the whole rest of the prompt beside the decode rows
    monkeypatch.setattr(scheduler_module, "Budget", lambda tokens, rows: Budget(0, rows))
    check = checks(run(mixed_step=True))["mixed_step"]
    assert check["holds"] is False and check["value"] > check["bound"]


@pytest.mark.parametrize("mode", ["fused", "cost"])
def test_fused_and_cost_keep_their_own_rules(mode):
    trace = run(mode, mixed_step=True, prefill_grant_interval=16)
    assert not any(t["action"] == "mixed" for t in trace["ticks"])
    assert "mixed_step" not in checks(trace) and all(c["ok"] for c in trace["checks"])
