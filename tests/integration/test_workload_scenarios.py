"""`coopsched run PATH.toml` and [workload] scenarios in virtual time: closed loops hold their
concurrency, replays reproduce their file, seeds reproduce bytes, and every bad input is a
one-line error with exit 2 and no traceback."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from factories import cli_error_line

from coopsched.cli import main as cli
from coopsched.core import MODES
from harness.run import runner, scenario
from harness.run.scenario import Scenario

SMALL = """
[workload]
num_requests = 12
arrival = "poisson"
rate_per_s = 40
prompt_len = { min = 4, max = 24 }
max_tokens = { mean = 12, sigma = 0.5 }
speculative_share = 0.5
"""


def write(tmp_path: Path, text: str, name: str = "mine.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def run(scen: Scenario, mode: str = "slice", seed: int = 0):
    return runner.execute(scen, runner.scenario_config(scen, mode), seed)


# -- running a file ------------------------------------------------------------------------

def test_a_relative_path_runs_that_file_named_after_its_stem(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", SMALL, "my-load.toml")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "t.json"
    assert cli(["run", "sub/my-load.toml", "--mode", "slice", "--json", str(out)]) == 0
    (trace,) = json.loads(out.read_text())
    assert trace["scenario"] == "my-load" and len(trace["requests"]) == 12
    assert [r["id"] for r in trace["requests"]] == [f"w{i:04d}" for i in range(12)]


def test_a_file_without_extension_runs_too_and_shipped_names_still_resolve(tmp_path, monkeypatch):
    write(tmp_path, SMALL, "loadfile")
    monkeypatch.chdir(tmp_path)
    assert scenario.resolve("loadfile") == Path("loadfile")
    assert scenario.resolve("concurrency2") == scenario.SCENARIO_DIR / "concurrency2.toml"


def test_description_and_proves_are_optional_and_requests_sit_beside_a_workload(tmp_path):
    path = write(tmp_path, SMALL + """
[[requests]]
id = "probe"
arrival_ms = 100
prompt_len = 8
max_tokens = 20
speculative = false
""")
    scen = Scenario.load(path)
    assert (scen.name, scen.description, scen.proves) == ("mine", "", "")
    done = run(scen)
    assert done.requests[0].id == "probe" and done.requests[0].arrival_ms == 100
    assert len(done.requests) == 13 and all(done.token_times[r.id] for r in done.requests)


def test_workload_accept_prob_feeds_the_mock_drafter(tmp_path):
    never = Scenario.load(write(tmp_path, SMALL + "accept_prob = 0.0\n", "never.toml"))
    always = Scenario.load(write(tmp_path, SMALL + "accept_prob = 1.0\n", "always.toml"))
    assert never.mock == {"accept_prob": 0.0} and always.mock == {"accept_prob": 1.0}
    assert run(never).scheduler.obs.accepted_tokens == 0
    assert run(always).scheduler.obs.accepted_tokens == run(always).scheduler.obs.drafted_tokens > 0


def test_every_mode_passes_on_a_generated_workload(tmp_path):
    scen = Scenario.load(write(tmp_path, SMALL))
    for mode in MODES:
        trace = runner.run_scenario(scen, mode)
        assert all(c["ok"] for c in trace["checks"]), (mode, trace["checks"])


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    path = write(tmp_path, SMALL)
    one, two, other = tmp_path / "1.json", tmp_path / "2.json", tmp_path / "3.json"
    for out, seed in ((one, "5"), (two, "5"), (other, "6")):
        assert cli(["run", str(path), "--mode", "all", "--seed", seed, "--json", str(out)]) == 0
    assert one.read_bytes() == two.read_bytes()
    assert one.read_bytes() != other.read_bytes()


def test_open_loop_for_a_fixed_list_runner_and_closed_loop_refused(tmp_path):
    scen = Scenario.load(write(tmp_path, SMALL))
    fixed = scen.for_seed(3)
    assert fixed.workload is None and fixed.requests == scen.specs(3)
    closed = Scenario.load(write(tmp_path, '[workload]\nnum_requests = 3\narrival = "closed"\nconcurrency = 1\n',
                                 "closed.toml"))
    with pytest.raises(ValueError, match="closed-loop workload runs in virtual time only"):
        closed.for_seed(0)


# -- closed loop -----------------------------------------------------------------------------

def in_flight_at_arrivals(done) -> list[int]:
    """Requests in flight (arrival <= t < last token) at each arrival instant."""
    spans = [(r.arrival_ms, done.token_times[r.id][-1]) for r in done.requests]
    return [sum(a <= t < end for a, end in spans) for t, _ in spans]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("num", "users"), [(40, 4), (30, 1), (9, 16)], ids=["4-users", "one-user", "more-users"])
def test_closed_loop_never_exceeds_and_reaches_its_concurrency(tmp_path, mode, num, users):
    scen = Scenario.load(write(tmp_path, f"""
[workload]
num_requests = {num}
arrival = "closed"
concurrency = {users}
start_ms = 5
prompt_len = {{ min = 4, max = 40 }}
max_tokens = {{ min = 2, max = 30 }}
speculative_share = 0.5
"""))
    done = run(scen, mode)
    counts = in_flight_at_arrivals(done)
    assert max(counts) == min(users, num)
    if num >= users:  # every arrival is a user's next request: the loop stays full until it runs out
        assert set(counts) == {users}
    arrivals = sorted(r.arrival_ms for r in done.requests)
    finishes = sorted(done.token_times[r.id][-1] for r in done.requests)
    assert arrivals[: min(users, num)] == [5.0] * min(users, num)
    assert arrivals[users:] == finishes[: max(num - users, 0)]  # each sent the instant a previous one finished


def test_explicit_requests_beside_a_closed_loop_keep_their_arrivals(tmp_path):
    scen = Scenario.load(write(tmp_path, """
[workload]
num_requests = 6
arrival = "closed"
concurrency = 1
max_tokens = 10

[[requests]]
id = "probe"
arrival_ms = 30
max_tokens = 40
speculative = false
"""))
    done = run(scen)
    probe, *looped = done.requests
    assert probe.arrival_ms == 30
    spans = sorted((r.arrival_ms, done.token_times[r.id][-1]) for r in looped)
    assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))  # one user: one at a time
    assert any(probe.arrival_ms < end and start < done.token_times["probe"][-1] for start, end in spans)


def test_closed_loop_trace_records_the_arrivals_it_ran(tmp_path):
    path = write(tmp_path, '[workload]\nnum_requests = 8\narrival = "closed"\nconcurrency = 2\nmax_tokens = 5\n')
    out = tmp_path / "t.json"
    assert cli(["run", str(path), "--mode", "slice", "--json", str(out)]) == 0
    requests = json.loads(out.read_text())[0]["requests"]
    assert [r["arrival_ms"] for r in requests][:2] == [0.0, 0.0]
    ends = sorted(r["token_times_ms"][-1] for r in requests)
    assert sorted(r["arrival_ms"] for r in requests)[2:] == ends[:6]


# -- replay ------------------------------------------------------------------------------------

REPLAY = [
    {"arrival_ms": 0, "prompt_len": 12, "max_tokens": 20},
    {"arrival_ms": 3.5, "prompt": "Hello, world", "speculative": False},
    {"arrival_ms": 3.5, "prompt_len": 30, "max_tokens": 7, "speculative": True},
    {"arrival_ms": 250, "prompt_len": 5, "max_tokens": 40, "speculative": False},
]


def test_replay_reproduces_the_file(tmp_path):
    lines = [json.dumps(line) for line in REPLAY]
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.jsonl").write_text("\n".join(lines[:2]) + "\n\n   \n" + "\n".join(lines[2:]) + "\n")
    scen = Scenario.load(write(tmp_path, '[workload]\ntrace = "traces/t.jsonl"\nmax_tokens = 25\n'))
    done = run(scen)
    assert [r.id for r in done.requests] == ["w0000", "w0001", "w0002", "w0003"]
    assert [r.arrival_ms for r in done.requests] == [line["arrival_ms"] for line in REPLAY]
    assert [r.max_tokens for r in done.requests] == [20, 25, 7, 25]  # the missing one and the 40: the cap
    assert [r.speculative for r in done.requests] == [True, False, True, False]
    assert bytes(done.requests[1].prompt_token_ids) == b"Hello, world"
    assert [len(r.prompt_token_ids) for r in done.requests] == [12, 12, 30, 5]
    assert all(len(r.output_token_ids) == r.max_tokens for r in done.requests)
    trace = runner.run_scenario(scen, "slice")
    assert [r["arrival_ms"] for r in trace["requests"]] == [0.0, 3.5, 3.5, 250.0]


def test_replay_defaults_and_start_offset(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"arrival_ms": 10, "prompt_len": 3}\n{"arrival_ms": 2, "prompt_len": 4}\n')
    scen = Scenario.load(write(tmp_path, '[workload]\ntrace = "t.jsonl"\nstart_ms = 100\n'))
    specs = scen.specs(0)
    assert [(s.arrival_ms, s.prompt_len, s.max_tokens, s.speculative) for s in specs] == \
        [(102.0, 4, 64, True), (110.0, 3, 64, True)]  # sorted by arrival; 64 tokens by default


# -- bad input: one line, exit 2, no traceback ---------------------------------------------------

GOOD = {"num_requests": "10", "arrival": '"poisson"', "rate_per_s": "5"}


def table(**keys) -> str:
    """A [workload] table: GOOD with `keys` changed (None drops one)."""
    merged = {**GOOD, **keys}
    return "[workload]\n" + "".join(f"{k} = {v}\n" for k, v in merged.items() if v is not None)


BAD = [  # id, scenario text, files beside it, fragments the message must hold
    ("unknown-arrival", table(arrival='"bursty"'), {}, ['arrival = "bursty"', "poisson, gamma, constant, closed"]),
    ("no-arrival", table(arrival=None), {}, ["arrival is missing"]),
    ("zero-rate", table(rate_per_s="0"), {}, ["rate_per_s = 0", "number > 0"]),
    ("negative-rate", table(rate_per_s="-2.5"), {}, ["rate_per_s = -2.5"]),
    ("zero-concurrency", table(arrival='"closed"', rate_per_s=None, concurrency="0"), {},
     ["concurrency = 0", "int >= 1"]),
    ("no-concurrency", table(arrival='"closed"', rate_per_s=None), {}, ["concurrency is missing"]),
    ("rate-on-closed", table(arrival='"closed"', concurrency="2"), {}, ["rate_per_s = 5 does not apply", "open loop"]),
    ("concurrency-on-open", table(concurrency="4"), {}, ["concurrency = 4 does not apply", '"closed"']),
    ("burstiness-on-poisson", table(burstiness="0.5"), {}, ["burstiness = 0.5 does not apply", '"gamma"']),
    ("zero-burstiness", table(arrival='"gamma"', burstiness="0"), {}, ["burstiness = 0", "number > 0"]),
    ("zero-requests", table(num_requests="0"), {}, ["num_requests = 0", "int >= 1"]),
    ("share-above-one", table(speculative_share="1.5"), {}, ["speculative_share = 1.5", "[0, 1]"]),
    ("share-negative", table(speculative_share="-0.1"), {}, ["speculative_share = -0.1", "[0, 1]"]),
    ("accept-prob-above-one", table(accept_prob="2"), {}, ["accept_prob = 2", "[0, 1]"]),
    ("accept-prob-twice", table(accept_prob="0.5") + "[mock]\naccept_prob = 0.4\n", {},
     ["accept_prob is set in both [workload] and [mock]"]),
    ("dist-wrong-keys", table(prompt_len="{ mean = 10 }"), {}, ["prompt_len has keys mean", "{min = a, max = b}"]),
    ("dist-mixed-keys", table(max_tokens="{ min = 1, sigma = 2 }"), {}, ["max_tokens has keys min, sigma"]),
    ("dist-min-above-max", table(max_tokens="{ min = 9, max = 3 }"), {}, ["max_tokens: min = 9 > max = 3"]),
    ("dist-float-bounds", table(prompt_len="{ min = 1.5, max = 3 }"), {}, ["min = 1.5", "ints >= 1"]),
    ("dist-zero-length", table(prompt_len="0"), {}, ["prompt_len = 0", "must be >= 1"]),
    ("dist-negative-sigma", table(prompt_len="{ mean = 10, sigma = -1 }"), {}, ["sigma = -1", "sigma a number >= 0"]),
    ("dist-text", table(prompt_len='"long"'), {}, ['prompt_len = "long"', "an int >= 1"]),
    ("unknown-workload-key", table(rps="3"), {}, ["unknown key 'rps'", "accepted: num_requests, arrival, rate_per_s"]),
    ("trace-missing-file", '[workload]\ntrace = "nowhere/t.jsonl"\n', {}, ["trace file not found:", "nowhere/t.jsonl"]),
    ("trace-not-json", '[workload]\ntrace = "t.jsonl"\n', {"t.jsonl": '{"arrival_ms": 0, "prompt_len": 3}\n{oops\n'},
     ["t.jsonl:2: not a JSON object"]),
    ("trace-not-an-object", '[workload]\ntrace = "t.jsonl"\n', {"t.jsonl": "[1, 2]\n"},
     ["t.jsonl:1: want a JSON object"]),
    ("trace-no-arrival", '[workload]\ntrace = "t.jsonl"\n', {"t.jsonl": '\n{"prompt_len": 3}\n'},
     ["t.jsonl:2: arrival_ms = null", "required"]),
    ("trace-negative-arrival", '[workload]\ntrace = "t.jsonl"\n', {"t.jsonl": '{"arrival_ms": -1, "prompt_len": 3}\n'},
     ["t.jsonl:1: arrival_ms = -1"]),
    ("trace-bad-prompt-len", '[workload]\ntrace = "t.jsonl"\n', {"t.jsonl": '{"arrival_ms": 0, "prompt_len": 0}\n'},
     ["t.jsonl:1: prompt_len = 0", "int >= 1"]),
    ("trace-no-prompt", '[workload]\ntrace = "t.jsonl"\n', {"t.jsonl": '{"arrival_ms": 0}\n'},
     ["t.jsonl:1: give exactly one of prompt_len"]),
    ("trace-both-prompts", '[workload]\ntrace = "t.jsonl"\n',
     {"t.jsonl": '{"arrival_ms": 0, "prompt_len": 2, "prompt": "hi"}\n'}, ["t.jsonl:1: give exactly one of"]),
    ("trace-bad-max-tokens", '[workload]\ntrace = "t.jsonl"\n',
     {"t.jsonl": '{"arrival_ms": 0, "prompt": "hi", "max_tokens": 0}\n'}, ["t.jsonl:1: max_tokens = 0"]),
    ("trace-bad-speculative", '[workload]\ntrace = "t.jsonl"\n',
     {"t.jsonl": '{"arrival_ms": 0, "prompt": "hi", "speculative": "yes"}\n'}, ['t.jsonl:1: speculative = "yes"']),
    ("trace-unknown-key", '[workload]\ntrace = "t.jsonl"\n',
     {"t.jsonl": '{"arrival_ms": 0, "prompt": "hi", "id": 3}\n'},
     ["t.jsonl:1: unknown key 'id'", "accepted: arrival_ms"]),
    ("trace-empty", '[workload]\ntrace = "t.jsonl"\n', {"t.jsonl": "\n\n"}, ["t.jsonl holds no requests"]),
    ("trace-and-generation", '[workload]\ntrace = "t.jsonl"\narrival = "poisson"\n',
     {"t.jsonl": '{"arrival_ms": 0, "prompt": "hi"}\n'}, ["drop arrival"]),
    ("no-requests-at-all", 'description = "nothing"\n', {}, ["no [[requests]] and no [workload]"]),
    ("invalid-toml", "[workload\n", {}, ["not valid TOML"]),
    ("unknown-top-key", SMALL + "[[request]]\nid = 'x'\n", {}, ["unknown key 'request'", "[[requests]]"]),
    ("name-not-stem", 'name = "other"\n' + SMALL, {}, ["named after its file ('mine')"]),
    ("unknown-scheduler-key", SMALL + "[scheduler]\nmax_batch = 4\n", {}, ["[scheduler] unknown key 'max_batch'",
                                                                          "max_batch_size"]),
    ("unknown-check", SMALL + "[checks]\nclasic_itl = {}\n", {}, ["[checks] unknown key 'clasic_itl'"]),
    ("generated-id-clash", SMALL + '[[requests]]\nid = "w0003"\n', {}, ["request id 'w0003' is also a generated one"]),
    ("too-long-for-a-slot", table(prompt_len="4000", max_tokens="200"), {},
     ["request 'w0000' needs 4200 tokens", "a KV slot holds 4096"]),
]


@pytest.mark.parametrize(("text", "files", "fragments"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_naming_the_value(tmp_path, capsys, text, files, fragments):
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    line = cli_error_line(capsys, ["run", str(write(tmp_path, text)), "--mode", "slice"])
    for fragment in fragments:
        assert fragment in line


def test_unknown_name_lists_the_scenarios_and_says_a_path_works(capsys):
    line = cli_error_line(capsys, ["run", "no-such-scenario"])
    assert "unknown scenario 'no-such-scenario'" in line
    assert all(name in line for name in scenario.available()) and "path" in line


def test_a_missing_toml_path_prints_that_path(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = cli_error_line(capsys, ["run", "missing/load.toml"])
    assert "scenario file not found: missing/load.toml" in line


def test_the_shipped_poisson_mix_is_a_generated_workload():
    scen = scenario.load("poisson-mix")
    assert scen.workload is not None and scen.workload.arrival == "poisson" and not scen.requests
    specs = scen.specs(0)
    assert 160 <= len(specs) <= 200
    assert sum(s.speculative for s in specs) == round(0.3 * len(specs))


def test_poisson_mix_checks_fail_when_slices_regress_to_a_burst(monkeypatch):
    """The checks it ships are honest: a 'slice' run that bursts fails each of them."""
    from coopsched.core import Scheduler
    monkeypatch.setattr(runner, "make_scheduler", lambda kind, config, params: Scheduler(config.with_(mode="burst")))
    checks = {c["name"]: c for c in runner.run_scenario(scenario.load("poisson-mix"), "slice")["checks"]}
    assert not checks["burst_wall"]["ok"] and not checks["spec_streaming"]["ok"]
    assert checks["parity"]["ok"] and checks["kv_released"]["ok"]


@pytest.mark.parametrize(("name", "num"), [("overload-2k", 2000), ("overload-10k", 10_000)])
def test_the_benchmark_workloads_load(name, num):
    path = Path(__file__).resolve().parents[1] / "bench" / "workloads" / f"{name}.toml"
    scen = scenario.load(str(path))
    assert scen.name == name and scen.workload.num_requests == num and scen.workload.arrival == "poisson"
    assert scen.scheduler == {"max_batch_size": 32, "num_kv_slots": 64}
    assert scen.checks == {"parity": False, "vs_burst": False}  # one scheduler run, kv_released only
    assert not scen.runs_reference("parity") and not scen.runs_reference("vs_burst")


@pytest.mark.parametrize("argv", [["run", "concurrency2"], ["sweep", "poisson-mix", "--rates", "4", "--mode", "slice",
                                                           "--seeds", "1"]], ids=["run", "sweep"])
def test_an_unparseable_gate_warns_on_stderr_and_the_run_goes_on(argv, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a sweep stores reports/sweeps/latest.json here
    monkeypatch.setenv("MLXCEL_DRAFT_BLOCK_SIZE", "eight")
    assert cli(argv) == 0
    err = capsys.readouterr().err
    assert err.count("warning: MLXCEL_DRAFT_BLOCK_SIZE='eight' is not an integer; keeping K=4") == 1


def test_a_target_where_nothing_listens_is_one_line(capsys):
    from harness.live.client import free_port
    port = free_port()  # nothing listens there
    line = cli_error_line(capsys, ["run", "concurrency2", "--target", f"http://127.0.0.1:{port}"])
    assert f"--target http://127.0.0.1:{port}: no server answered" in line
