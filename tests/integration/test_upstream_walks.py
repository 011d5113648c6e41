"""Upstream's walks, in the trace of a real run (virtual time): a chunked prompt beside three decoding
rows gets one chunk every `interval + 1` ticks; interval 0 starves it until the rows drain; under a
speculative slice at interval 4 the ticks repeat S D S D S D S D S P; the mixed step runs every tick."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.run import runner, scenario

LETTER = {"spec_round": "S", "decode": "D", "prefill": "P", "mixed": "M", "idle": "I"}


def walk_scenario(tmp_path: Path, prompt_len: int, spec: bool = False) -> scenario.Scenario:
    """Three classic rows and a long prompt, all at t = 0, prefilled one token a tick; optionally a
    speculative request first (one token a round, so its rounds outlast the walk)."""
    rows = [f'[[requests]]\nid = "c{i}"\nprompt_len = 1\nmax_tokens = 1100\nspeculative = false\n'
            for i in range(3)]
    first = '[[requests]]\nid = "s"\nprompt_len = 1\nmax_tokens = 400\naccept_script = [0]\n' if spec else ""
    path = tmp_path / "walk.toml"
    path.write_text("[scheduler]\nprefill_chunk_tokens = 1\nmax_batch_size = 4\n\n" + first + "\n".join(rows)
                    + f'\n[[requests]]\nid = "long"\nprompt_len = {prompt_len}\nmax_tokens = 4\n'
                      "speculative = false\n")
    return scenario.load(str(path))


def walk(scen: scenario.Scenario, mode: str = "slice", **options) -> tuple[str, dict]:
    """The actions after the long prompt's admission (its first chunk), one letter a tick."""
    trace = runner.run_scenario(scen, mode, options=options)
    ticks = trace["ticks"]
    start = next(i for i, t in enumerate(ticks) if t["request_ids"] == ["long"]) + 1
    return "".join(LETTER[t["action"]] for t in ticks[start:]), trace


@pytest.mark.parametrize("interval", range(1, 17))
def test_a_chunked_prompt_gets_a_chunk_every_interval_plus_one_ticks(tmp_path, interval):
    letters, trace = walk(walk_scenario(tmp_path, 600), prefill_grant_interval=interval)
    first = letters[:1000]
    assert set(first) == {"D", "P"}
    assert first.index("P") == interval
    assert max(len(run) for run in first.split("P")) == interval
    assert first.count("P") == 1000 // (interval + 1)
    assert all(c["ok"] for c in trace["checks"])


def test_interval_zero_starves_the_chunked_prompt_until_the_rows_drain(tmp_path):
    letters, trace = walk(walk_scenario(tmp_path, 600), prefill_grant_interval=0)
    assert letters[:1000] == "D" * 1000
    drained = letters.index("P")
    assert set(letters[:drained]) == {"D"} and letters[drained:drained + 599] == "P" * 599
    last_row_token = max(r["token_times_ms"][-1] for r in trace["requests"] if r["id"].startswith("c"))
    assert trace["ticks"][-600]["start_ms"] >= last_row_token  # its chunks began once the rows were done


def test_a_speculative_slice_cannot_starve_the_chunked_prompt(tmp_path):
    letters, _ = walk(walk_scenario(tmp_path, 600, spec=True), prefill_grant_interval=4)
    assert letters[:60] == "SDSDSDSDSP" * 6


def test_the_mixed_step_runs_a_chunk_beside_the_decode_rows_every_tick(tmp_path):
    letters, trace = walk(walk_scenario(tmp_path, 1200), mixed_step=True)
    assert letters[:1000] == "M" * 1000
    mixed = [t for t in trace["ticks"] if t["action"] == "mixed"][:3]
    assert [t["request_ids"] for t in mixed] == [["c0", "c1", "c2", "long"]] * 3
    assert [t["prefill_tokens"] for t in mixed] == [[0, 0, 0, 1]] * 3


def test_the_gate_sets_the_interval_and_the_flag_wins_over_it(tmp_path, monkeypatch):
    scen = walk_scenario(tmp_path, 600)
    monkeypatch.setenv("MLXCEL_PREFILL_GRANT_INTERVAL", "0")  # the chunked prompt runs once the batch drains
    assert walk(scen)[0][:1000] == "D" * 1000
    monkeypatch.setenv("MLXCEL_PREFILL_GRANT_INTERVAL", " 4 ")
    assert walk(scen)[0].index("P") == 4
    monkeypatch.setenv("MLXCEL_PREFILL_GRANT_INTERVAL", "16x")  # garbage: the default, 16
    assert walk(scen)[0].index("P") == 16
    assert walk(scen, prefill_grant_interval=2)[0].index("P") == 2


def test_interval_one_is_july_cadence_a_chunk_after_every_decode():
    """The July rule ran a chunk after every decode step: interval 1 gives that cadence back."""
    def cadence(**options) -> str:
        trace = runner.run_scenario(scenario.load("long-prompt"), "slice", options=options)
        ticks = [t for t in trace["ticks"] if t["end_ms"] <= trace["requests"][4]["token_times_ms"][0]]
        start = next(i for i, t in enumerate(ticks) if t["request_ids"] == ["long-classic"])
        return "".join("C" if t["detail"] == "chunk" else LETTER[t["action"]] for t in ticks[start:])
    assert cadence(prefill_grant_interval=1) == "CD" * 7 + "C"
    assert cadence().startswith(("C" + "D" * 16) * 5)  # the default, 16 (then the rows are done)
