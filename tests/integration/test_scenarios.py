"""The scenarios in virtual time: exact bounds, and proof that each bound catches the legacy burst."""

import json

import pytest

from coopsched.cli import main as cli
from coopsched.core import MODES
from harness.run import runner, scenario, trace_json


def checks_of(trace) -> dict:
    return {c["name"]: c for c in trace["checks"]}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", scenario.available())
def test_every_expectation_holds(name, mode):
    trace = runner.run_scenario(scenario.load(name), mode)
    failed = [c for c in trace["checks"] if not c["ok"]]
    assert not failed, failed


def test_concurrency2_slice_bound_is_exact_and_burst_breaks_it():
    scen = scenario.load("concurrency2")
    cost = runner.scenario_cost(scen, 0)
    b = cost.decode(1) + cost.round(4)
    slice0 = cost.slice0(len(scen.requests[1].prompt_tokens(0)))
    sliced = runner.execute(scen, runner.scenario_config(scen, "slice"))
    gaps = [y - x for x, y in zip(sliced.token_times["classic"], sliced.token_times["classic"][1:])]
    over = [g for g in gaps if g > b + 1e-9]
    assert over == [pytest.approx(b + slice0)]  # once, at admission: slice 0 + round 1 back to back
    assert max(gaps) == pytest.approx(b + slice0)

    burst = runner.execute(scen, runner.scenario_config(scen, "burst"))
    gaps = [y - x for x, y in zip(burst.token_times["classic"], burst.token_times["classic"][1:])]
    whole = burst.scheduler.obs.bursts[0].burst_wall_ms
    assert max(gaps) >= whole > 10 * b  # the classic row waited out the whole speculative request
    check = checks_of(runner.run_scenario(scen, "burst"))["classic_itl"]
    assert check["holds"] is False and check["ok"] is True and check["expect"] == "fail"


def test_slice_checks_fail_when_the_scheduler_regresses_to_a_burst(monkeypatch):
    from coopsched.core import Scheduler
    monkeypatch.setattr(runner, "make_scheduler", lambda kind, config, params: Scheduler(config.with_(mode="burst")))
    checks = checks_of(runner.run_scenario(scenario.load("concurrency2"), "slice"))
    assert not checks["classic_itl"]["ok"] and not checks["burst_wall"]["ok"]
    assert not checks["spec_streaming"]["ok"]


def test_slice_check_fails_when_the_yield_flag_is_never_set(monkeypatch):
    from coopsched.core import books
    monkeypatch.setattr(books, "next_yield_flag", lambda flag, action: False)
    checks = checks_of(runner.run_scenario(scenario.load("concurrency2"), "slice"))
    assert not checks["classic_itl"]["ok"]


def two_rounds_per_classic_action(real):
    """A planted regression: under contention the job takes a second round before each classic action."""
    from coopsched.core.policy import Decision
    from coopsched.core.types import ActionKind

    taken = {"extra": False}

    def decide(state, *knobs):
        if state.has_spec_work and state.last_was_spec and state.num_running > 0 and not taken["extra"]:
            taken["extra"] = True
            return Decision(ActionKind.SPEC_ROUND, None, state.decode_ticks)
        decision = real(state, *knobs)
        if decision.action is not ActionKind.SPEC_ROUND:
            taken["extra"] = False
        return decision
    return decide


LONG_SPEC_PROMPT = """[checks]
classic_itl = {}

[[requests]]
id = "classic"
max_tokens = 96
speculative = false

[[requests]]
id = "spec"
arrival_ms = 40
prompt_len = 400
max_tokens = 64
"""


@pytest.mark.parametrize("name", ["concurrency2", "rotation", "poisson-mix", "long-spec-prompt"])
def test_classic_itl_catches_a_second_round_per_gap(name, monkeypatch, tmp_path):
    """The slice bound allows one round per gap (+ one per Prefill after a round in it, + slice 0 once, in its own
    gap): a long speculative prompt, a parked waiter or arrivals during decode do not loosen the rest."""
    from coopsched.core.modes import slice as slice_mode
    path = tmp_path / f"{name}.toml"
    path.write_text(LONG_SPEC_PROMPT)
    scen = scenario.load(str(path) if name == "long-spec-prompt" else name)
    assert checks_of(runner.run_scenario(scen, "slice"))["classic_itl"]["ok"]
    monkeypatch.setattr(slice_mode, "decide_today", two_rounds_per_classic_action(slice_mode.decide_today))
    check = checks_of(runner.run_scenario(scen, "slice"))["classic_itl"]
    assert not check["ok"] and check["value"] > check["bound"]


def test_a_round_tick_that_runs_the_whole_request_fails_even_on_measured_terms(monkeypatch):
    """On a real clock with no cost model the time bounds come from the ticks themselves, so a tick
    that ran every remaining round sets its own bound; rounds_per_slice counts rounds, not ms."""
    from coopsched.core import TickKind
    from coopsched.core.scheduler import Scheduler
    from harness.verdict.virtual import evaluate
    monkeypatch.setattr(Scheduler, "_keeps_slot", lambda self, plan: plan.kind in (TickKind.BURST, TickKind.ROUND))
    scen = scenario.load("concurrency2")
    run = runner.execute(scen, runner.scenario_config(scen, "slice"))
    run.cost = None  # the real-backend path: terms from measured ticks
    checks = {c.name: c for c in evaluate(run, classic=None, burst=None)}
    assert checks["burst_wall"].ok  # ... which a whole-request tick passes by construction
    assert not checks["rounds_per_slice"].ok and checks["rounds_per_slice"].value > 1


def test_the_decode_term_is_the_largest_batch_a_decode_served(tmp_path):
    """Fifty classic requests one after another, one decoding at a time: a gap is priced at a
    decode of one row, not fifty (nor the batch size)."""
    from harness.run.bounds import largest_decode_batch, terms_of
    specs = "".join(f'[[requests]]\nid = "c{i}"\narrival_ms = {400 * i}\nmax_tokens = 12\nspeculative = false\n\n'
                    for i in range(50))
    path = tmp_path / "sequential.toml"
    path.write_text('[checks]\nclassic_itl = {}\n\n' + specs + '[[requests]]\nid = "spec"\nmax_tokens = 400\n')
    scen = scenario.load(str(path))
    run = runner.execute(scen, runner.scenario_config(scen, "slice"))
    assert largest_decode_batch(run) == 1 and terms_of(run).decode_ms == run.cost.decode(1) < run.cost.decode(8)
    assert checks_of(runner.run_scenario(scen, "slice"))["classic_itl"]["ok"]


def test_burst_wall_slice_vs_legacy():
    scen = scenario.load("concurrency2")
    cost = runner.scenario_cost(scen, 0)
    sliced = runner.execute(scen, runner.scenario_config(scen, "slice")).scheduler.obs.bursts[0]
    legacy = runner.execute(scen, runner.scenario_config(scen, "burst")).scheduler.obs.bursts[0]
    one = max(cost.round(4), cost.slice0(32))
    assert sliced.burst_wall_ms <= 1.05 * one and sliced.burst_wall_ms <= legacy.burst_wall_ms / 5
    assert legacy.slices == 1 and legacy.burst_wall_ms == legacy.burst_active_ms
    assert sliced.slices == sliced.rounds + 1 and sliced.burst_active_ms == pytest.approx(legacy.burst_active_ms)


def test_burst_streams_one_lump_and_slice_per_round():
    scen = scenario.load("concurrency2")
    legacy = runner.execute(scen, runner.scenario_config(scen, "burst"))
    assert len(set(legacy.token_times["spec"])) == 1
    sliced = runner.execute(scen, runner.scenario_config(scen, "slice"))
    assert len(set(sliced.token_times["spec"])) == sliced.scheduler.obs.bursts[0].slices


def test_same_seed_same_bytes_other_seed_differs():
    scen = scenario.load("parity-b1")
    one = trace_json.dumps([runner.run_scenario(scen, "slice", seed=3)])
    assert one == trace_json.dumps([runner.run_scenario(scen, "slice", seed=3)])
    assert one != trace_json.dumps([runner.run_scenario(scen, "slice", seed=4)])


def test_waiter_parking_quirk_is_reproduced_counted_and_visible():
    trace = runner.run_scenario(scenario.load("rotation"), "slice")
    assert trace["observability"]["waiter_parks"] >= 1
    ticks = trace["ticks"]
    park = next(i for i, t in enumerate(ticks) if t["detail"] == "park")
    # round, park (a Prefill tick with no model work clears the yield flag), round: back to back
    assert ticks[park - 1]["action"] == "spec_round" and ticks[park + 1]["action"] == "spec_round"
    assert ticks[park]["end_ms"] == ticks[park]["start_ms"]
    classic = next(r for r in trace["requests"] if r["id"] == "classic")
    gap_ends = [t for t in classic["token_times_ms"] if t > ticks[park]["end_ms"]]
    assert gap_ends and gap_ends[0] >= ticks[park + 1]["end_ms"]
    # ... and the classic row's HOL wait spans both rounds: the park serves nobody, so ends no wait
    both = sum(ticks[i]["end_ms"] - ticks[i]["start_ms"] for i in (park - 1, park + 1))
    assert trace["observability"]["hol_wait_ms"]["max"] == pytest.approx(both)


def test_cli_bare_run_and_json(tmp_path):
    out = tmp_path / "trace.json"
    assert cli(["run", "concurrency2", "--json", str(out)]) == 0
    (trace,) = json.loads(out.read_text())
    assert trace["mode"] == "slice" and trace["clock"] == "virtual"
    for key in ("requests", "ticks", "bursts", "checks"):
        assert trace[key]
    assert set(trace["requests"][0]) >= {"id", "speculative", "prompt_token_ids", "token_ids",
                                         "token_times_ms", "arrival_ms", "finish_reason"}
    assert set(trace["bursts"][0]) >= {"seq_id", "burst_wall_ms", "burst_active_ms", "slices", "rounds",
                                       "accepted_draft_tokens", "tokens_generated", "hol_waiters"}


def test_mode_flag_wins_over_the_slice_gate(monkeypatch, tmp_path):
    monkeypatch.setenv("MLXCEL_MTP_TICK_SLICE", "0")
    out = tmp_path / "t.json"
    assert cli(["run", "concurrency2", "--json", str(out)]) == 0
    assert json.loads(out.read_text())[0]["mode"] == "burst"
    assert cli(["run", "concurrency2", "--mode", "slice", "--json", str(out)]) == 0
    assert json.loads(out.read_text())[0]["mode"] == "slice"


def test_gates_that_leave_no_speculation_skip_spec_checks(monkeypatch, tmp_path):
    monkeypatch.setenv("MLXCEL_ENABLE_MTP_B1", "0")
    out = tmp_path / "t.json"
    assert cli(["run", "concurrency2", "--json", str(out)]) == 0
    checks = checks_of(json.loads(out.read_text())[0])
    assert checks["classic_itl"].get("skipped") and checks["burst_wall"].get("skipped")
    assert not any(r["speculative"] for r in json.loads(out.read_text())[0]["requests"])


def test_environment_turns_a_scenarios_batch_default_off(monkeypatch):
    scen = scenario.load("parity-batched")
    assert runner.scenario_config(scen, "slice").enable_batch
    monkeypatch.setenv("MLXCEL_ENABLE_MTP_BATCH", "0")
    trace = runner.run_scenario(scen, "slice")
    assert checks_of(trace)["window"].get("skipped")
    assert all(t["detail"] != "window" for t in trace["ticks"])


def test_batched_window_yields_between_rounds():
    trace = runner.run_scenario(scenario.load("parity-batched"), "slice")
    window = next(t for t in trace["ticks"] if t["detail"] == "window")
    assert len(window["request_ids"]) == 4
    rounds = [t for t in trace["ticks"] if t["action"] == "spec_round"]
    assert rounds and len(rounds[0]["request_ids"]) == 4
    finished_at = {r["id"]: r["token_times_ms"][-1] for r in trace["requests"]}
    for t in rounds:  # a row that finished no longer takes part in the window's rounds
        assert all(finished_at[i] >= t["end_ms"] for i in t["request_ids"])


@pytest.mark.parametrize("value", ["bogus", "DFLASH"])
def test_invalid_draft_kind_is_a_startup_error(monkeypatch, capsys, value):
    monkeypatch.setenv("MLXCEL_DRAFT_KIND", value)
    assert cli(["run", "concurrency2"]) != 0
    assert repr(value) in capsys.readouterr().out


def test_dflash_runs_every_speculative_request_as_a_burst(monkeypatch):
    monkeypatch.setenv("MLXCEL_DRAFT_KIND", "dflash")
    trace = runner.run_scenario(scenario.load("concurrency2"))
    assert trace["mode"] == "slice" and trace["bursts"][0]["slices"] == 1
    check = checks_of(trace)["classic_itl"]
    assert check["holds"] is False and check["expect"] == "fail"  # the HOL block is reported, as expected
