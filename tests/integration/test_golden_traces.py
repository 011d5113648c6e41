"""Traces stored before the plan/execute/commit redesign: the same seed still gives the same bytes.

Stored again since: when each trace request gained `eligible`, and when the slice bound of
`classic_itl` became exact per gap (a round per Prefill after a round in the gap, slice 0 only in
its own gap, decode at the largest decode batch); each time a check showed nothing else moved. Then
once more when a tick that only parks a waiter stopped ending HOL waits (only
`observability.hol_wait_ms` of rotation and parity-b1 in slice mode moved), when sliced runs gained
the `rounds_per_slice` check, and when a request that arrives during a tick began to wait from its
arrival (only `bursts[].hol_waiters` and `observability` moved). Then when the legacy burst's
`rotation` check stopped being skipped and became one it must fail (only that check moved).

Regenerate only on purpose (a behaviour change someone decided on), with
`python tests/integration/test_golden_traces.py` and a commit message that says why.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

from coopsched.cli import main as cli

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "traces"
PROFILE = Path(__file__).resolve().parents[2] / "scenarios" / "profiles" / "mlx-cpu-s.json"
# the scenarios the stored files hold: a scenario shipped later is not part of them
STORED = ["concurrency2", "many-classic", "parity-b1", "parity-batched", "rotation"]
RUNS = {  # stored file -> the `coopsched run` arguments that made it
    "all-modes-seed0": [*STORED, "--mode", "all", "--seed", "0"],
    "all-modes-seed1": [*STORED, "--mode", "all", "--seed", "1"],
    "all-modes-mlx-cpu-s": [*STORED, "--mode", "all", "--seed", "0", "--cost", str(PROFILE)],
}
SIM_SEEDS = 400


def run_trace(args: list[str], out: Path) -> str:
    assert cli(["run", *args, "--json", str(out)]) == 0
    return out.read_text()


def simulate_counts() -> dict:
    """Counts with prefill at its defaults: the seeds that also draw chunked and batched
    prefill (coopsched simulate's default) run other ticks by design."""
    from harness.sim.simulate import FAULT_NAMES, run_chunk

    outcome = run_chunk((0, SIM_SEEDS, FAULT_NAMES, False))
    assert not outcome.failures, outcome.failures[:3]
    return dict(sorted(outcome.counts.items()))


@pytest.mark.parametrize("name", RUNS)
def test_trace_is_byte_identical_to_the_stored_one(name, tmp_path):
    want = gzip.decompress((GOLDEN / f"{name}.json.gz").read_bytes()).decode()
    got = run_trace(RUNS[name], tmp_path / "trace.json")
    if got != want:  # name the first run and key that moved, not a 700 kB diff
        for old, new in zip(json.loads(want), json.loads(got)):
            moved = [k for k in old if old[k] != new.get(k)]
            assert not moved, f"{old['scenario']}/{old['mode']}: {moved} changed"
    assert got == want


def test_fault_simulation_counts_are_unchanged():
    want = json.loads((GOLDEN / "simulate-counts.json").read_text())
    assert simulate_counts() == want


if __name__ == "__main__":  # regenerate
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in RUNS.items():
            text = run_trace(args, Path(tmp) / "t.json")
            (GOLDEN / f"{name}.json.gz").write_bytes(gzip.compress(text.encode(), 9, mtime=0))
    (GOLDEN / "simulate-counts.json").write_text(json.dumps(simulate_counts(), indent=1) + "\n")
    sys.exit(0)
