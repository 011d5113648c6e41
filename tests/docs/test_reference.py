"""docs/reference/*.md name every subcommand, flag, gate, metric family and JSON key the program has.

The names are read from the program (parsers, env.py's table, a live /metrics, real
JSON outputs), never from a list kept here; each kind of check is shown to fail on a
planted name. Regenerate the pages with `python tools/gen_reference.py`.
"""

from __future__ import annotations

import copy
import dataclasses

import gen_reference as gen
import pytest


@pytest.fixture(scope="module")
def facts() -> gen.Facts:
    return gen.collect()


def test_every_name_the_program_has_has_its_line(facts):
    found = gen.problems(facts, gen.read_pages())
    assert not found, "\n".join(found)


def test_pages_are_what_the_generator_writes(facts):
    pages = gen.read_pages()
    stale = [name for name, text in gen.render(facts).items() if pages.get(name) != text]
    assert not stale, f"docs/reference/{', '.join(stale)} differ from the code: run `{gen.REGENERATE}`"


def test_names_come_from_the_program(facts):
    """Not a fixed list: the sources hold what the pages must name."""
    run = next(c for c in facts.commands if c.path == "coopsched run")
    assert {"--mode", "--json", "--seed", "--target", "NAME"} <= {a.name for a in run.args}
    assert "coopsched model build" in {c.path for c in facts.commands}
    assert {"MLXCEL_MTP_TICK_SLICE", "COOPSCHED_HOL_BUDGET_MS"} <= {g.name for g in facts.gates}
    assert "coopsched_inter_token_latency_seconds" in {f.name for f in facts.metrics}
    assert {"requests[].token_times_ms", "ticks[].action", "checks[].bound"} <= set(facts.keys["trace"])
    assert "capacity.*" in facts.keys["sweep"] and "per_request[].token_times_ms" in facts.keys["locust"]


def test_a_planted_flag_fails_the_check(facts, monkeypatch):
    import harness.run.cli as run_cli

    real = run_cli.add_arguments

    def planted(parser):
        real(parser)
        parser.add_argument("--planted-flag", help="a flag with no line")

    monkeypatch.setattr(run_cli, "add_arguments", planted)
    found = gen.problems(dataclasses.replace(facts, commands=gen.collect_cli()), gen.read_pages())
    assert found == [f"docs/reference/cli.md has no line for `--planted-flag` of `coopsched run`: "
                     f"run `{gen.REGENERATE}`"]


def test_a_planted_gate_fails_the_check(facts, monkeypatch):
    from coopsched import env

    monkeypatch.setattr(env, "GATES", (*env.GATES, env.Gate("MLXCEL_PLANTED", "off", "a gate with no line")))
    gates, mentions = gen.collect_gates()
    found = gen.problems(dataclasses.replace(facts, gates=gates, gate_mentions=mentions | {"MLXCEL_ELSEWHERE"}),
                         gen.read_pages())
    assert any("no line (or no parse table) for MLXCEL_PLANTED" in line for line in found), found
    assert any(line.startswith("MLXCEL_ELSEWHERE is read in the source but is not in") for line in found), found
    assert len(found) == 2, found


def test_a_planted_metric_fails_the_check(facts, monkeypatch):
    from prometheus_client import Counter

    from coopsched.server import metrics

    real = metrics.Metrics.__init__

    def planted(self):
        real(self)
        Counter("coopsched_planted_total", "a family with no line", registry=self.registry)

    monkeypatch.setattr(metrics.Metrics, "__init__", planted)
    found = gen.problems(dataclasses.replace(facts, metrics=gen.collect_metrics()), gen.read_pages())
    assert found[0] == f"docs/reference/metrics.md has no line for `coopsched_planted_total`: run `{gen.REGENERATE}`"
    assert "no unit and meaning for metric `coopsched_planted_total`" in found[1] and len(found) == 2, found


def test_a_planted_trace_key_fails_the_check(facts):
    traces = copy.deepcopy(facts.outputs["trace"][:1])
    traces[0]["requests"][0]["planted_key"] = 1
    traces[0]["planted_top"] = {}
    keys = dict(facts.keys, trace=gen.key_paths(traces, gen.load_meanings()["trace"]))
    found = gen.problems(dataclasses.replace(facts, keys=keys), gen.read_pages())
    missing = [line for line in found if "has no line for" in line]
    assert missing == [f'docs/reference/trace-json.md has no line for `requests[].planted_key` under "Trace JSON": '
                       f"run `{gen.REGENERATE}`",
                       f'docs/reference/trace-json.md has no line for `planted_top` under "Trace JSON": '
                       f"run `{gen.REGENERATE}`"]
    assert len(found) == 4, found  # and neither has a meaning in the data file


def test_a_data_map_is_one_line_and_a_free_block_is_not_walked():
    meanings = {"capacity": "", "capacity.*": "", "calibrated.**": ""}
    doc = {"capacity": {"slice": 6, "fused": None}, "calibrated": {"fit": {"a": 1}}}
    assert gen.key_paths([doc], meanings) == ["capacity", "capacity.*", "calibrated.**"]
