"""Replaying the public trace formats: each small file written here replays to its exact arrivals
and lengths, the controls beside a trace (speedup, num_requests, start_ms, max_tokens,
speculative_share) do what they say, a sweep's --rates scale a trace, and a malformed row is
one line naming FILE:LINE with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import cli_error_line

from coopsched.cli import main as cli
from harness.run import runner
from harness.run.scenario import Scenario

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,12,5
2023-11-16 18:15:46.6925900,30,7
2023-11-16 18:15:47.6810000,4,3
2023-11-16 18:15:47.6805900,9,2
"""
AZURE_ARRIVALS = [0.0, 12.0, 1000.0, 1000.41]  # sorted: the last row came before the third
AZURE_LENGTHS = [(12, 5), (30, 7), (9, 2), (4, 3)]

MOONCAKE = "\n".join(json.dumps(r) for r in [
    {"timestamp": 27482, "input_length": 10, "output_length": 4, "hash_ids": [46, 47]},
    {"timestamp": 27500, "input_length": 20, "output_length": 6, "hash_ids": [46, 48, 49]},
    {"timestamp": 30000, "input_length": 6, "output_length": 2, "hash_ids": []},
]) + "\n"

BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,12,4,16,Conversation log
5.25,GPT-4,20,0,20,Conversation log
6.5,ChatGPT,8,3,11,API log
7,GPT-4,15,0,15,API log
9.125,ChatGPT,6,5,11,Conversation log
"""


def scenario_for(tmp_path: Path, name: str, text: str, extra: str = "") -> Scenario:
    (tmp_path / name).write_text(text)
    path = tmp_path / "replay.toml"
    path.write_text(f'[workload]\ntrace = "{name}"\n{extra}')
    return Scenario.load(path)


def shape(scen: Scenario, seed: int = 0) -> list[tuple]:
    return [(s.arrival_ms, s.prompt_len, s.max_tokens) for s in scen.specs(seed)]


def test_azure_date_times_replay_to_the_ms(tmp_path):
    scen = scenario_for(tmp_path, "AzureLLMInferenceTrace_code.csv", AZURE)
    assert shape(scen) == [(a, p, m) for a, (p, m) in zip(AZURE_ARRIVALS, AZURE_LENGTHS)]
    done = runner.execute(scen, runner.scenario_config(scen, "slice"))
    assert [len(r.prompt_token_ids) for r in done.requests] == [p for p, _ in AZURE_LENGTHS]
    assert [len(r.output_token_ids) for r in done.requests] == [m for _, m in AZURE_LENGTHS]


def test_azure_offsets_are_utc_and_speedup_two_halves_every_arrival(tmp_path):
    text = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:01.5+00:00,3,2\n"
            "2024-05-10 02:00:00.009+02:00,3,2\n")
    scen = scenario_for(tmp_path, "a.csv", text)
    assert [s.arrival_ms for s in scen.specs(0)] == [0.0, 1491.0]  # 02:00:00.009+02:00 is 00:00:00.009 UTC
    fast = scenario_for(tmp_path, "AzureLLMInferenceTrace_code.csv", AZURE, "speedup = 2\n")
    assert shape(fast) == [(a / 2, p, m) for a, (p, m) in zip(AZURE_ARRIVALS, AZURE_LENGTHS)]


def test_mooncake_replays_and_keeps_hash_ids_in_the_trace_json(tmp_path):
    scen = scenario_for(tmp_path, "mooncake_trace.jsonl", MOONCAKE)
    assert shape(scen) == [(0.0, 10, 4), (18.0, 20, 6), (2518.0, 6, 2)]
    trace = runner.run_scenario(scen, "slice")
    assert [r["hash_ids"] for r in trace["requests"]] == [[46, 47], [46, 48, 49], []]
    assert [len(r["token_ids"]) for r in trace["requests"]] == [4, 6, 2]


def test_burstgpt_leaves_failed_rows_out_and_says_how_many(tmp_path, capsys):
    scen = scenario_for(tmp_path, "BurstGPT_1.csv", BURSTGPT)
    assert shape(scen) == [(0.0, 12, 4), (1500.0, 8, 3), (4125.0, 6, 5)]
    assert scen.workload.notes == (f"{tmp_path / 'BurstGPT_1.csv'}: 2 failed requests (0 response tokens) left out",)
    assert cli(["run", str(tmp_path / "replay.toml"), "--mode", "slice"]) == 0
    assert "note: " in capsys.readouterr().err


def test_empty_prompts_are_left_out_and_a_byte_order_mark_is_no_header(tmp_path):
    text = "\ufeff" + AZURE.replace("2023-11-16 18:15:47.6810000,4,3", "2023-11-16 18:15:47.6810000,0,3")
    scen = scenario_for(tmp_path, "a.csv", text)
    assert shape(scen) == [(a, p, m) for a, (p, m) in zip(AZURE_ARRIVALS[:3], AZURE_LENGTHS[:3])]
    assert scen.workload.notes == (f"{tmp_path / 'a.csv'}: 1 requests with an empty prompt left out",)


def test_coopsched_jsonl_is_still_read_as_written(tmp_path):
    lines = '{"arrival_ms": 40, "prompt_len": 3}\n{"arrival_ms": 10, "prompt": "hi", "max_tokens": 9}\n'
    scen = scenario_for(tmp_path, "t.jsonl", lines, 'trace_format = "coopsched"\n')
    assert shape(scen) == [(10.0, 16, 9), (40.0, 3, 64)]  # absolute arrivals; a prompt's length is its text's


def test_controls_beside_a_trace(tmp_path):
    scen = scenario_for(tmp_path, "AzureLLMInferenceTrace_code.csv", AZURE,
                        'num_requests = 3\nstart_ms = 100\nmax_tokens = 4\nspeedup = 4\naccept_prob = 0.5\n'
                        'trace_format = "azure"\n')
    assert shape(scen) == [(100.0, 12, 4), (103.0, 30, 4), (350.0, 9, 2)]  # first 3, /4, +100, capped at 4
    assert scen.mock["accept_prob"] == 0.5


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_speculative_share_makes_exactly_round_share_n_eligible(tmp_path, seed):
    rows = "".join(f"{i * 0.01:.2f},ChatGPT,8,3,11,API log\n" for i in range(200))
    scen = scenario_for(tmp_path, "b.csv", BURSTGPT.splitlines()[0] + "\n" + rows, "speculative_share = 0.25\n")
    flags = [s.speculative for s in scen.specs(seed)]
    assert len(flags) == 200 and sum(flags) == 50
    others = [s.speculative for s in scen.specs(seed + 1)]
    assert sum(others) == 50 and others != flags  # seeded: another seed, another subset of the same size


def test_speculative_share_leaves_lines_that_say_alone(tmp_path):
    lines = "".join(json.dumps({"arrival_ms": i, "prompt_len": 2, **({"speculative": False} if i < 4 else {})}) + "\n"
                    for i in range(12))
    scen = scenario_for(tmp_path, "t.jsonl", lines, "speculative_share = 0.5\n")
    flags = [s.speculative for s in scen.specs(0)]
    assert flags[:4] == [False] * 4 and sum(flags[4:]) == 4  # round(0.5 x the 8 that do not say)


def test_a_rate_sweep_scales_the_trace(tmp_path):
    scenario_for(tmp_path, "AzureLLMInferenceTrace_code.csv", AZURE)
    out = tmp_path / "sweep.json"
    assert cli(["sweep", str(tmp_path / "replay.toml"), "--rates", "1,4", "--mode", "slice", "--seeds", "1",
                "--json", str(out)]) == 0
    sweep = json.loads(out.read_text())
    assert sweep["load_unit"] == "speedup" and [p["load"] for p in sweep["points"]] == [1, 4]
    spans = [p["span_s"] for p in sweep["points"]]
    assert spans[1] < spans[0] / 2  # four times as fast: the last arrival at 250 ms, not 1000 ms


def test_a_concurrency_sweep_runs_the_trace_as_a_closed_loop(tmp_path):
    scenario_for(tmp_path, "mooncake_trace.jsonl", MOONCAKE)
    out = tmp_path / "sweep.json"
    assert cli(["sweep", str(tmp_path / "replay.toml"), "--concurrency", "1", "--mode", "slice", "--seeds", "1",
                "--json", str(out)]) == 0
    (point,) = json.loads(out.read_text())["points"]
    assert point["requests"] == 3 and point["span_s"] < 1.0  # the file's 2.5 s of arrivals are not waited out


BAD = [  # id, file name, text, scenario extra, fragments
    ("azure-bad-time", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,2\nyesterday,3,2\n",
     "", [":3: TIMESTAMP = \"yesterday\"", "date-time"]),
    ("azure-bad-count", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3,2\n"
     "2023-11-16 18:15:47,many,2\n", "", [":3: ContextTokens = \"many\"", "whole number >= 0"]),
    ("azure-short-row", "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,3\n", "",
     [":2: want 3 cells"]),
    ("burstgpt-negative", "b.csv", BURSTGPT.replace("6.5,ChatGPT,8,3", "6.5,ChatGPT,8,-3"), "",
     [":4: Response tokens = \"-3\"", "whole number >= 0"]),
    ("mooncake-bad-hashes", "m.jsonl", MOONCAKE.replace("[46, 48, 49]", '"abc"'), "",
     [":2: hash_ids = \"abc\"", "list of integers"]),
    ("mooncake-not-json", "m.jsonl", MOONCAKE + "{oops\n", "", [":4: not a JSON object"]),
    ("wrong-format-forced", "m.jsonl", MOONCAKE, 'trace_format = "azure"\n', [":1: a azure CSV needs the columns"]),
    ("unknown-header", "x.csv", "time,in,out\n1,2,3\n", "", [":1: cannot tell the trace format", "set trace_format"]),
    ("bad-format-name", "m.jsonl", MOONCAKE, 'trace_format = "sharegpt"\n', ['trace_format = "sharegpt"',
                                                                            "auto, coopsched, azure"]),
    ("zero-speedup", "m.jsonl", MOONCAKE, "speedup = 0\n", ["speedup = 0", "number > 0"]),
    ("cap-not-int", "m.jsonl", MOONCAKE, "max_tokens = { min = 1, max = 3 }\n", ["beside a trace it is a cap"]),
    ("zero-num-requests", "m.jsonl", MOONCAKE, "num_requests = 0\n", ["num_requests = 0", "first N"]),
    ("all-failed", "b.csv", BURSTGPT.splitlines()[0] + "\n1,GPT-4,20,0,20,API log\n", "",
     ["holds no requests", "1 failed requests"]),
]


@pytest.mark.parametrize(("name", "text", "extra", "fragments"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_malformed_trace_is_one_line_naming_its_line(tmp_path, capsys, name, text, extra, fragments):
    (tmp_path / name).write_text(text)
    (tmp_path / "replay.toml").write_text(f'[workload]\ntrace = "{name}"\n{extra}')
    line = cli_error_line(capsys, ["run", str(tmp_path / "replay.toml"), "--mode", "slice"])
    for fragment in fragments:
        assert fragment in line, line
    assert str(tmp_path / name) in line or "trace_format" in line or "speedup" in line or "[workload]" in line
