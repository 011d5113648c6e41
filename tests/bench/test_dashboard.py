"""The Grafana dashboard (dashboards/coopsched.json) queries only what the server's /metrics exports.

The exported names come from the server itself: `Metrics().render()`, after an engine watched by
it has served a few requests (the step books export a kind's series once it ran), is the body
`GET /metrics` serves, parsed with prometheus_client's own parser. Without the
server's dependencies (prometheus_client), the test falls back to the names in
the README's `/metrics` list, copied below.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "coopsched.json"

# the README's metric names: counters (exported with _total), histograms, gauges
CONTRACT_COUNTERS = ("coopsched_spec_rounds_total", "coopsched_spec_draft_tokens_total",
                     "coopsched_spec_accepted_tokens_total", "coopsched_spec_slices_total")
CONTRACT_HISTOGRAMS = ("coopsched_burst_wall_seconds", "coopsched_hol_wait_seconds",
                       "coopsched_time_to_first_token_seconds", "coopsched_inter_token_latency_seconds")
CONTRACT_GAUGES = ("coopsched_hol_waiters_max", "coopsched_requests_running", "coopsched_requests_waiting",
                   "coopsched_kv_slots_in_use")

PROMQL_WORDS = frozenset("""
sum min max avg count stddev stdvar topk bottomk quantile count_values group by without on ignoring
group_left group_right and or unless offset bool rate irate increase delta idelta deriv predict_linear
histogram_quantile abs ceil floor round clamp clamp_min clamp_max sort sort_desc time vector scalar
label_replace label_join avg_over_time max_over_time min_over_time sum_over_time count_over_time
last_over_time absent absent_over_time changes resets exp ln log2 log10 sqrt timestamp inf nan
""".split())


def exported() -> tuple[set[str], dict[str, set[str]], str]:
    """(sample names, {label: values}, source) of what /metrics exports."""
    try:
        from prometheus_client.parser import text_string_to_metric_families

        from coopsched.server.metrics import Metrics
    except ImportError:
        names = set(CONTRACT_COUNTERS) | set(CONTRACT_GAUGES) | {
            h + suffix for h in CONTRACT_HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
        return names, {"le": set(), "kind": {"classic", "spec"}}, "contract"
    from factories import make_engine, make_requests

    metrics, engine = Metrics(), make_engine()
    engine.on_tick = metrics.record_tick
    metrics.watch(engine.scheduler)
    metrics.watch_engine(engine)
    engine.run(make_requests(2, speculative=False, prefix="c") + make_requests(1, prefix="s"))
    samples = [s for family in text_string_to_metric_families(metrics.render().decode())
               for s in family.samples]
    labels: dict[str, set[str]] = {}
    for s in samples:
        for key, value in s.labels.items():
            labels.setdefault(key, set()).add(value)
    return {s.name for s in samples}, labels, "server"


def queries(node) -> list[str]:
    """Every PromQL expression in the dashboard (panels, rows' panels, templating)."""
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [q for value in node.values() for q in queries(value)]
    if isinstance(node, list):
        return [q for item in node for q in queries(item)]
    return []


def problems(expr: str, names: set[str], labels: dict[str, set[str]]) -> list[str]:
    """What in one query does not name something /metrics exports (empty when it is fine)."""
    found = []
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        for label, value in re.findall(r'(\w+)\s*=~?\s*"([^"]*)"', matchers):
            if label not in labels:
                found.append(f"label {label!r} is not exported")
            elif labels[label] and value not in labels[label]:
                found.append(f"{label}={value!r} is not an exported value ({sorted(labels[label])})")
    for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        found += [f"label {g!r} is not exported" for g in re.findall(r"\w+", grouping) if g not in labels]
    bare = re.sub(r'\{[^}]*\}|"[^"]*"|\[[^\]]*\]|\$\w+|\b(?:by|without)\s*\([^)]*\)', " ", expr)
    metrics = [w for w in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare) if w.lower() not in PROMQL_WORDS]
    found += [f"metric {m!r} is not exported" for m in metrics if m not in names]
    if not metrics:
        found.append("names no metric at all")
    return found


def test_every_dashboard_query_names_a_metric_the_server_exports():
    names, labels, source = exported()
    exprs = queries(json.loads(DASHBOARD.read_text()))
    assert len(exprs) >= 10
    bad = {expr: p for expr in exprs if (p := problems(expr, names, labels))}
    assert not bad, f"checked against the {source}'s names: {bad}"


def test_the_dashboard_covers_what_the_issue_asks_for():
    text = " ".join(queries(json.loads(DASHBOARD.read_text())))
    for family in ("coopsched_inter_token_latency_seconds", "coopsched_time_to_first_token_seconds",
                   "coopsched_hol_wait_seconds", "coopsched_burst_wall_seconds", "coopsched_spec_rounds_total",
                   "coopsched_spec_accepted_tokens_total", "coopsched_kv_slots_in_use"):
        assert family in text, family
    assert 'kind="classic"' in text and "by (le, kind)" in text  # classic vs speculative ITL


def test_the_server_exports_every_contract_name():
    names, _, source = exported()
    if source != "server":
        pytest.skip("prometheus_client is not installed: the server's names cannot be read")
    wanted = set(CONTRACT_COUNTERS) | set(CONTRACT_GAUGES) | {h + "_bucket" for h in CONTRACT_HISTOGRAMS}
    assert wanted <= names, sorted(wanted - names)


@pytest.mark.parametrize(("expr", "complaint"), [
    ("sum(rate(coopsched_spec_round_total[5m]))", "coopsched_spec_round_total"),   # a typo
    ("up", "'up'"),                                                                 # not ours
    ('sum(rate(coopsched_inter_token_latency_seconds_bucket{kind="fused"}[5m]))', "fused"),
    ("histogram_quantile(0.9, sum by (le, model) (rate(coopsched_hol_wait_seconds_bucket[5m])))", "model"),
    ("vector(1)", "no metric"),
], ids=["typo", "foreign-metric", "unknown-label-value", "unknown-label", "no-metric"])
def test_the_check_catches_a_bad_query(expr, complaint):
    names, labels, _ = exported()
    assert any(complaint in p for p in problems(expr, names, labels))
