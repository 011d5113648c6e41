"""`coopsched simulate`: deterministic per seed, exercises every fault, reports a replayable seed.

The 10 000-seed run itself is a command of the default tox env (tox.ini).
"""

from __future__ import annotations

import pytest

from coopsched import cli
from coopsched.core import MODES
from harness.sim import simulate


def test_a_seed_replays_exactly():
    first = simulate.run_seed(7, simulate.FAULT_NAMES)
    again = simulate.run_seed(7, simulate.FAULT_NAMES)
    other = simulate.run_seed(8, simulate.FAULT_NAMES)
    assert first == again
    assert first != other


def test_chunked_parallel_run_equals_the_serial_one():
    serial = simulate.simulate(120, 0, simulate.FAULT_NAMES, jobs=1)
    parallel = simulate.simulate(120, 0, simulate.FAULT_NAMES, jobs=2)
    assert serial.counts == parallel.counts and serial.seeds == parallel.seeds == 120


def test_every_fault_of_the_mix_is_exercised():
    """A simulation that silently stopped injecting faults would pass for nothing."""
    counts = simulate.simulate(300, 0, simulate.FAULT_NAMES).counts
    exercised = {
        "cancel between ticks": counts["event:cancel"],
        "disconnect mid-round": sum(counts[f"fired:disconnect:{c}"] for c in ("prefill", "decode", "draft")),
        "disconnect between draft and verify": counts["fired:disconnect:verify"],
        "KV exhaustion (admission waited)": counts["kv_full_ticks"],
        "request too long for a slot": counts["refused:too-long"],
        "drafter outage": counts["event:drafter-down"],
        "backend raises for one request": sum(v for k, v in counts.items() if k.startswith("fired:raise:")),
        "plain backend exception": sum(v for k, v in counts.items() if k.startswith("fired:generic:")),
        "requests ended in error": counts["finish:error"],
        "rotation": counts["rotations"],
    }
    assert all(exercised.values()), exercised
    assert {m for m in MODES if counts[f"mode:{m}"]} == set(MODES)


def test_without_faults_no_request_ends_in_error():
    counts = simulate.simulate(200, 0, ()).counts
    assert counts["finish:error"] == 0 and counts["finish:length"] > 0
    assert not [k for k in counts if k.startswith("fired:")]


def test_cli_runs_and_summarizes(capsys):
    assert cli.main(["simulate", "--seeds", "60", "--start", "100", "--jobs", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "60 seeds in" in out and "all seeds passed" in out
    assert "fault fired: disconnect:verify" in out


@pytest.mark.parametrize("faults, message", [
    ("cancel,bogus", "unknown fault(s) bogus"),
    ("drafter,", None),
], ids=["unknown-fault", "trailing-comma-ok"])
def test_fault_list_is_validated(faults, message, capsys):
    code = cli.main(["simulate", "--seeds", "2", "--faults", faults, "--jobs", "1", "--no-progress"])
    out = capsys.readouterr().out
    if message is None:
        assert code == 0
    else:
        assert code == 2 and message in out and "disconnect-verify" in out
