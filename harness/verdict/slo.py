"""The SLO's verdict: `coopsched judge` passes iff the share of requests meeting the per-token SLO
(harness/run/slo.py: TTFT and EVERY gap within it) reaches the target."""

from __future__ import annotations

from harness.verdict.check import Check


def slo_check(result: dict, target: float) -> Check:
    """`coopsched judge`: the share of requests meeting the per-token SLO (harness/run/slo.py) >= target;
    with no request to judge, skipped."""
    attained = result["slo_attainment"]
    if attained is None:
        return Check.skip("slo_attainment", "no request to judge")
    return Check("slo_attainment", attained >= target, attained, target,
                 note=f"{result['met']} of {result['requests']} requests meet the SLO")
