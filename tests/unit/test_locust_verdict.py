"""The locust verdict (harness/verdict/live.py) on hand-written samples: a burst fails it, slices pass,
a kind without samples is skipped (ok null, never a pass), a failed request fails it either way."""

from __future__ import annotations

from itertools import pairwise

from harness.live import stalls
from harness.live.client import Arrival, Collected
from harness.live.samples import Samples, sample_of
from harness.verdict.live import locust_verdict, stall_check, with_locust_failures

MS = 1_000_000
COSTS = {"decode_ms": 5.0, "round_ms": 30.0, "slice0_fixed_ms": 2.0, "slice0_per_token_ms": 0.1}


def sample(kind: str, sent_ms: float, times_ms: list[float], failed: str | None = None) -> dict:
    ns = [round(t * MS) for t in times_ms]
    st = stalls.Stream(f"{kind}-{sent_ms}", kind, round(sent_ms * MS), tuple(ns), tuple(ns))
    return {"ttft_ns": [ns[0] - st.sent_ns] if ns else [], "gaps_ns": [b - a for a, b in pairwise(ns)],
            "failed": failed, "prompt_tokens": [16], "events": len(ns), "tokens": len(ns), "stream": st.to_json(),
            "request": {"id": st.id, "kind": kind, "error": failed}}


def samples(classic_ms: list[float], spec_ms: list[float] | None) -> Samples:
    s = Samples()
    s.add("classic", sample("classic", 0.0, classic_ms))
    if spec_ms is not None:
        s.add("spec", sample("spec", 0.0, spec_ms))
    return s


def sliced() -> Samples:
    """A classic token every 35 ms, a round of 4 speculative tokens 30 ms into each gap."""
    classic = [35.0 * i for i in range(1, 30)]
    return samples(classic, [t - 5 for t in classic[1:17] for _ in range(4)])


def test_slices_pass_with_every_check_held():
    report = locust_verdict(sliced().data, COSTS)
    assert report["ok"] is True and report["bound_ms"] == 35.0
    assert [c["name"] for c in report["checks"]] == ["classic_itl_p99", "classic_itl", "failures"]
    assert all(c["ok"] is True for c in report["checks"])


def test_a_burst_inside_a_classic_gap_fails():
    classic = [5.0, 10.0, 810.0, 815.0] + [815.0 + 5 * i for i in range(1, 20)]
    report = locust_verdict(samples(classic, [805.0] * 64).data, COSTS)
    gap = next(c for c in report["checks"] if c["name"] == "classic_itl")
    assert report["ok"] is False and gap["ok"] is False and gap["stalls"]["hol"] == 1
    assert report["stalls"]["every_gap"]["worst_hol"]["evidence_tokens"] == 64


def test_a_kind_without_samples_is_skipped_not_passed():
    report = locust_verdict(samples([35.0 * i for i in range(1, 10)], None).data, COSTS)
    assert report["ok"] is None and report["missing"] == ["spec"]
    skipped = [c for c in report["checks"] if c.get("skipped")]
    assert [c["name"] for c in skipped] == ["classic_itl"] and skipped[0]["ok"] is None
    # locust's own failures count: with none the skip still is no pass, with one the run fails
    s = samples([35.0 * i for i in range(1, 10)], None)
    assert with_locust_failures(locust_verdict(s.data, COSTS), 0, s.data)["ok"] is None
    failed = with_locust_failures(locust_verdict(s.data, COSTS), 3, s.data)
    assert failed["ok"] is False and "3 request(s) failed" in failed["rule"]


def test_the_stall_check_keeps_the_rules_summary():
    classic = [0.0, 5.0, 805.0, 810.0]
    c = stalls.Stream("classic", "classic", 0, tuple(round(t * MS) for t in classic),
                      tuple(round(t * MS) for t in classic))
    s = stalls.Stream("spec", "spec", 0, (800 * MS,) * 64, (800 * MS,) * 64)
    check = stall_check("classic_itl", stalls.waits_of(c, 69.4), [c, s], stalls.Rule(tokens_per_round=4), "limit")
    assert check.holds is False and check.value == 800.0 and check.bound == 69.4
    assert check.to_json()["stalls"]["hol"] == 1 and "limit" in check.note


def test_the_soak_names_each_problem_from_its_checks():
    from harness.live.soak import checks, verdict

    fine = {"failures": 0, "rss_growth": 0.02, "idle_after": True, "server_exit_code": 0, "requests": 900}
    assert verdict(fine, 0.10) == [] and all(c.ok for c in checks(fine, 0.10))
    leaky = fine | {"rss_growth": 0.25, "idle_after": False}
    assert verdict(leaky, 0.10) == ["RSS grew 25.0% (limit 10%)",
                                    "the server still held slots or requests after the load"]


def test_what_a_cut_stream_read_after_the_stop_began_is_left_out():
    """Locust's stop holds every reader, then one stream reads its backlog and the other is killed
    after one token (3 of 12 runs against llama-server): judged, that lump is a head-of-line block
    of the server's; a stream the stop cut keeps only what it read before the stop began."""
    def got(sent_ms: float, times_ms: list[float]) -> Collected:
        return Collected(round(sent_ms * MS), [Arrival(round(t * MS), 1, [1], "x", None, None, {}) for t in times_ms])

    freeze, stop = 1000.0, 1020.0  # readers held from `freeze`; the stop fires 20 ms later
    classic = got(0.0, [5.0 * i for i in range(1, 201)] + [freeze + 100.0])  # one token read, then killed
    spec = got(950.0, [951.0 + i for i in range(40)] + [freeze + 95.0] * 24)  # its backlog at once
    for stopping, ok in ((None, False), (round(stop * MS), True)):
        s = Samples()
        s.add("classic", sample_of("classic", classic, None, True, stopping))
        s.add("spec", sample_of("spec", spec, None, False, stopping))
        report = locust_verdict(s.data, COSTS)
        assert report["ok"] is ok, report["stalls"]["every_gap"]
    assert report["tokens"] == {"classic": 200, "spec": 64}  # the uncut stream keeps every token
