"""The long-prompt scenario: with chunked prefill every classic gap holds at most one chunk
(+ one speculative action where a round ran); without chunking the same check fails with the
whole 2,000-token prefill inside one gap. Virtual time, exact; tokens unchanged either way."""

from __future__ import annotations

import itertools

import pytest

from harness.run import runner, scenario
from mocks import CostModel

COST = CostModel()   # the scenario's prices: prefill 2 ms + 0.2 ms a token (+0.05 with the drafter)
NONBURST = ("slice", "fused", "cost")


def run(mode: str, **options) -> dict:
    return runner.run_scenario(scenario.load("long-prompt"), mode, options=options)


def checks(trace: dict) -> dict:
    return {c["name"]: c for c in trace["checks"]}


def classic_gaps(trace: dict) -> list[tuple[float, float, float]]:
    """(gap, start, end) of every classic request's inter-token gaps."""
    return [(b - a, a, b) for r in trace["requests"] if not r["speculative"]
            for a, b in itertools.pairwise(r["token_times_ms"])]


@pytest.mark.parametrize("mode", NONBURST)
def test_with_chunks_of_256_every_classic_gap_holds_one_chunk(mode):
    trace = run(mode)
    stall = checks(trace)["prefill_stall"]
    assert stall["ok"] and stall["holds"] and stall["bound"] <= 73.0 + 20.0  # decode + chunk (+ a round)
    assert all(c["ok"] for c in trace["checks"])
    chunks = [t for t in trace["ticks"] if t["detail"] == "chunk"]
    assert {tuple(t["request_ids"]) for t in chunks} == {("long-classic",), ("long-spec",)}
    assert all(sum(t["prefill_tokens"]) <= 256 for t in chunks) and len(chunks) == 16  # 2 x ceil(2000 / 256)
    # the largest classic gap: one chunk of the speculative prompt (with its drafter) + a decode step
    worst = max(g for g, _, _ in classic_gaps(trace))
    assert worst <= COST.chunk(256, with_draft=True) + COST.decode(5) + 1e-9
    assert worst < COST.prefill(2000) / 5


@pytest.mark.parametrize("mode", NONBURST)
def test_without_chunking_the_same_check_fails_with_the_whole_prefill_in_one_gap(mode):
    trace = run(mode, prefill_chunk_tokens=0)
    stall = checks(trace)["prefill_stall"]
    assert stall["holds"] is False and not stall["ok"]
    assert not any(t["detail"] == "chunk" for t in trace["ticks"])
    admits = {t["request_ids"][0]: t for t in trace["ticks"] if t["detail"] in ("admit", "slice0")}
    for rid, whole in (("long-classic", COST.prefill(2000)), ("long-spec", COST.slice0(2000))):
        tick = admits[rid]
        assert tick["end_ms"] - tick["start_ms"] == pytest.approx(whole)
        gap = next(g for g, a, b in classic_gaps(trace) if a <= tick["start_ms"] and tick["end_ms"] <= b)
        assert gap >= whole  # the whole prefill inside one classic gap
    assert stall["value"] >= COST.slice0(2000)
    assert checks(trace)["parity"]["ok"]


def test_burst_mode_fails_it_as_it_must_and_batched_admission_changes_no_token():
    assert checks(run("burst"))["prefill_stall"]["holds"] is False
    trace = run("slice", max_batch_prefill=4)
    assert checks(trace)["parity"]["ok"] and checks(trace)["prefill_stall"]["ok"]


def test_a_burst_with_no_classic_row_to_stall_is_skipped_not_passed():
    """On a fast profile the classic rows are done before the long speculative prompt arrives: the
    must-fail check has nothing to catch and says so, where before it "held" and failed the run."""
    fast = CostModel.simple(decode_ms=1.0, round_ms=2.0, prefill_ms_per_token=0.02)
    trace = runner.run_scenario(scenario.load("long-prompt"), "burst",
                                backend_factory=lambda clock, scen, seed: runner.mock_backend(clock, scen, seed, fast))
    stall = checks(trace)["prefill_stall"]
    assert stall["skipped"] and stall["ok"] is None and "no classic row to stall" in stall["note"]
    spec_admit = next(t for t in trace["ticks"] if t["request_ids"] == ["long-spec"])
    assert all(r["token_times_ms"][-1] < spec_admit["start_ms"] for r in trace["requests"] if not r["speculative"])


def test_the_long_prompts_benchmark_twins_differ_only_in_chunking_and_chunking_meets_the_slo_more():
    """tests/bench/workloads/long-prompts*.toml: what a capacity sweep compares (poisson, lognormal
    prompts of mean 512 tokens); at 2 requests/s on the default mock, chunks of 256 raise the share
    of requests meeting itl_ms=100,ttft_ms=1000 in every mode."""
    from dataclasses import replace
    from pathlib import Path

    from harness.run import slo

    bench = Path(__file__).resolve().parents[1] / "bench" / "workloads"
    whole, chunked = (scenario.load(str(bench / f"{n}.toml")) for n in ("long-prompts", "long-prompts-chunked"))
    assert chunked.scheduler == {**whole.scheduler, "prefill_chunk_tokens": 256}
    assert chunked.workload == whole.workload
    target = slo.parse_slo("itl_ms=100,ttft_ms=1000")

    def attainment(scen, mode):
        scen = replace(scen, workload=replace(scen.workload, rate_per_s=2.0))
        run = runner.execute(scen, runner.scenario_config(scen, mode), seed=0)
        timings = [slo.RequestTiming(r.id, run.token_times[r.id][0] - r.arrival_ms,
                                     tuple(b - a for a, b in itertools.pairwise(run.token_times[r.id])))
                   for r in run.requests]
        return slo.attainment(target, timings)

    for mode in NONBURST:
        assert attainment(chunked, mode) > attainment(whole, mode) + 0.05
