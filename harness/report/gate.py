"""The tracked virtual-time metrics of a trace, the committed baseline, and the regression gate.

Virtual time is exact and reproducible, so these numbers can gate CI without
noise: `compare` fails, naming scenario/mode/metric, when one gets worse than
the baseline by more than 1% (`coopsched compare`'s rule, harness/compare/rule.py).
Wall-time figures are reported elsewhere, never gated. The baseline is one JSON
file per scenario in reports/baseline/, moved on purpose with
`coopsched report --update-baseline`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.compare import rule
from harness.compare.rule import Metric
from harness.run import metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
BASELINE_DIR = REPO_ROOT / "reports" / "baseline"
TOLERANCE = 0.01  # relative: worse by more than 1% fails

TRACKED = (
    Metric("classic_itl_p50_ms", "ms", False, "classic ITL p50"),
    Metric("classic_itl_p99_ms", "ms", False, "classic ITL p99"),
    Metric("classic_itl_max_ms", "ms", False, "classic ITL max (classic stall)"),
    Metric("stall_ms", "ms", False, "stall: largest ITL of any request"),
    Metric("burst_wall_ms", "ms", False, "burst_wall_ms (longest speculative tick)"),
    Metric("spec_ttft_p95_ms", "ms", False, "speculative TTFT p95"),
    Metric("aggregate_tok_s", "tok/s", True, "aggregate tokens/s"),
    Metric("spec_tok_s", "tok/s", True, "speculative tokens/s"),
    Metric("acceptance", "ratio", True, "draft acceptance (accepted / drafted)"),
)
BY_NAME = {m.name: m for m in TRACKED}


def _r(x) -> float | None:
    return None if x is None else round(float(x), 6)


def tracked_metrics(trace: Mapping) -> dict[str, float | None]:
    """The tracked metrics of one scenario x mode trace (the README's trace JSON), in virtual time.

    ITL percentiles pool every classic request's raw gaps; None where the run has
    no such sample (no classic row, no speculative request).
    """
    requests = trace["requests"]
    classic_gaps = np.asarray([g for r in requests if not r["speculative"] for g in metrics.itl(r["token_times_ms"])],
                              dtype=float)
    all_gaps = [max(metrics.itl(r["token_times_ms"])) for r in requests if len(r["token_times_ms"]) > 1]
    spec_ttft = [r["token_times_ms"][0] - r["arrival_ms"] for r in requests
                 if r["speculative"] and r["token_times_ms"]]
    obs = trace["observability"]
    has_gaps = classic_gaps.size > 0
    return {
        "classic_itl_p50_ms": _r(np.percentile(classic_gaps, 50)) if has_gaps else None,
        "classic_itl_p99_ms": _r(np.percentile(classic_gaps, 99)) if has_gaps else None,
        "classic_itl_max_ms": _r(classic_gaps.max()) if has_gaps else None,
        "stall_ms": _r(max(all_gaps)) if all_gaps else None,
        "burst_wall_ms": _r(max(b["burst_wall_ms"] for b in trace["bursts"])) if trace["bursts"] else None,
        "spec_ttft_p95_ms": _r(np.percentile(spec_ttft, 95)) if spec_ttft else None,
        "aggregate_tok_s": _r(trace["throughput"]["aggregate_tok_s"]),
        "spec_tok_s": _r(trace["throughput"]["spec_tok_s"]),
        "acceptance": _r(obs["accepted_tokens"] / obs["drafted_tokens"]) if obs["drafted_tokens"] else None,
    }


def metrics_of(traces: Iterable[Mapping]) -> dict[str, dict[str, dict]]:
    """{scenario: {mode: tracked metrics}} for a list of traces."""
    out: dict[str, dict[str, dict]] = {}
    for trace in traces:
        out.setdefault(trace["scenario"], {})[trace["mode"]] = tracked_metrics(trace)
    return out


# -- the baseline -------------------------------------------------------------
def load_baseline(directory: Path = BASELINE_DIR) -> dict[str, dict[str, dict]]:
    """{scenario: {mode: metrics}} from every reports/baseline/<scenario>.json."""
    out = {}
    for path in sorted(Path(directory).glob("*.json")):
        data = json.loads(path.read_text())
        out[data["scenario"]] = data["modes"]
    return out


def baseline_info(directory: Path = BASELINE_DIR) -> dict:
    """Where the baseline came from (commit, seed), from any one of its files."""
    for path in sorted(Path(directory).glob("*.json")):
        data = json.loads(path.read_text())
        return {"commit": data.get("commit"), "seed": data.get("seed")}
    return {}


def write_baseline(metrics: Mapping[str, Mapping[str, Mapping]], directory: Path = BASELINE_DIR,
                   *, commit: str | None = None, seed: int = 0) -> list[Path]:
    """Replace the baseline with these metrics: one sorted, stable JSON file per scenario."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.json"):
        if stale.stem not in metrics:
            stale.unlink()
    written = []
    for scenario, modes in sorted(metrics.items()):
        path = directory / f"{scenario}.json"
        body = {"scenario": scenario, "seed": seed, "commit": commit,
                "modes": {mode: dict(values) for mode, values in sorted(modes.items())}}
        path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
        written.append(path)
    return written


# -- the gate -----------------------------------------------------------------
@dataclass(frozen=True)
class Finding:
    key: str                 # scenario/mode/metric
    baseline: float | None
    current: float | None
    verdict: str             # worse | better | same | missing | new

    @property
    def change(self) -> float | None:
        if self.baseline in (None, 0) or self.current is None:
            return None
        return (self.current - self.baseline) / abs(self.baseline)

    def describe(self) -> str:
        metric = BY_NAME.get(self.key.rsplit("/", 1)[-1])
        unit = f" {metric.unit}" if metric else ""
        change = f" ({self.change:+.2%})" if self.change is not None else ""
        direction = ("higher" if metric.higher_is_better else "lower") + " is better" if metric else ""
        return f"{self.key}: {self.baseline}{unit} -> {self.current}{unit}{change}; {direction}"


def judge(metric: str, baseline: float | None, current: float | None) -> str:
    return rule.judge(BY_NAME[metric].higher_is_better, baseline, current, TOLERANCE)


def compare(current: Mapping[str, Mapping[str, Mapping]], baseline: Mapping[str, Mapping[str, Mapping]],
            ) -> list[Finding]:
    """A finding for every tracked metric of every scenario x mode in either side.

    A scenario x mode the baseline lacks is `new` (not gated until the baseline
    moves); one the current run lacks is `missing`, and fails like a regression.
    """
    flat = lambda side: {f"{s}/{m}": values for s, modes in side.items() for m, values in modes.items()}
    rows = rule.compare_tables(flat(baseline), flat(current), TRACKED, TOLERANCE)
    return [Finding(f"{r.key}/{r.metric}", r.base, r.new, r.verdict) for r in rows]


def failures(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.verdict in ("worse", "missing")]


def explain(findings: Iterable[Finding]) -> str:
    failed = failures(findings)
    if not failed:
        return "gate: every tracked metric within 1% of the baseline (or better)"
    lines = [f"gate: {len(failed)} tracked metric(s) worse than the baseline by more than "
             f"{TOLERANCE:.0%} (move it on purpose with `coopsched report --update-baseline`):"]
    lines += [f"  {f.verdict.upper()} {f.describe()}" for f in failed]
    return "\n".join(lines)
