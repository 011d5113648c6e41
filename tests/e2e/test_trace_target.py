"""A public-format trace replayed live with `coopsched run PATH --target URL` against `coopsched
serve` sends every request on its virtual-time twin's arrival schedule: within 5 ms each, plus
however late this machine woke a bare sleeping thread meanwhile (a probe beside the replay: on a
quiet machine well under 1 ms; on a shared, oversubscribed one, tens of ms that no client can
avoid)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from e2e_servers import clean_env

from coopsched.cli import main as cli

pytestmark = pytest.mark.e2e

SCHEDULE_TOLERANCE_MS = 5.0
# Mooncake-shaped: ms timestamps, lengths, prefix hashes; 10 requests over ~1.2 s of the file, replayed 2x
ROWS = [(1000, 24, 6), (1040, 12, 4), (1041, 40, 8), (1200, 16, 3), (1350, 8, 5),
        (1600, 32, 6), (1610, 20, 2), (1900, 12, 4), (2100, 28, 7), (2230, 10, 3)]


class Probe(threading.Thread):
    """Sleeps to a 10 ms grid until stopped and keeps how late (ms) each wake-up came."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stopped, self.late_ms = threading.Event(), [0.0]

    def run(self) -> None:
        origin, tick = time.perf_counter(), 0
        while not self.stopped.is_set():
            tick += 1
            delay = origin + tick * 0.01 - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            self.late_ms.append((time.perf_counter() - origin - tick * 0.01) * 1e3)


def test_a_live_trace_replay_keeps_its_twins_arrival_schedule(server, tmp_path):
    (tmp_path / "mooncake.jsonl").write_text("".join(
        json.dumps({"timestamp": t, "input_length": p, "output_length": o, "hash_ids": [i, i + 1]}) + "\n"
        for i, (t, p, o) in enumerate(ROWS)))
    (tmp_path / "replay.toml").write_text('[workload]\ntrace = "mooncake.jsonl"\nspeedup = 2\n'
                                          "speculative_share = 0.5\n")
    virtual, live = tmp_path / "virtual.json", tmp_path / "live.json"
    assert cli(["run", str(tmp_path / "replay.toml"), "--mode", "slice", "--json", str(virtual)]) == 0
    probe = Probe()
    probe.start()
    proc = subprocess.run([sys.executable, "-m", "coopsched.cli", "run", str(tmp_path / "replay.toml"), "--target",
                           server.url, "--json", str(live)], capture_output=True, text=True, timeout=120,
                          env=clean_env())
    probe.stopped.set()
    probe.join()
    assert live.exists(), proc.stdout + proc.stderr
    (twin,), (real,) = json.loads(virtual.read_text()), json.loads(live.read_text())
    planned = {r["id"]: r["arrival_ms"] for r in twin["requests"]}
    sent = {r["id"]: r["arrival_ms"] for r in real["requests"]}
    assert planned == {f"w{i:04d}": (t - ROWS[0][0]) / 2 for i, (t, _, _) in enumerate(ROWS)}
    assert set(sent) == set(planned)
    machine_ms = max(probe.late_ms)
    off = {i: round(sent[i] - planned[i], 3) for i in planned}
    print(f"send offsets vs the twin (ms): {off}; a bare sleeper woke up to {machine_ms:.1f} ms late")
    late = {i: ms for i, ms in off.items() if abs(ms) > SCHEDULE_TOLERANCE_MS + machine_ms}
    assert not late, (f"sent off schedule by more than {SCHEDULE_TOLERANCE_MS} ms + the machine's "
                      f"{machine_ms:.1f} ms: {late} (all: {off})")
    assert [r["eligible"] for r in real["requests"]] == [r["eligible"] for r in twin["requests"]]
    assert sum(r["eligible"] for r in twin["requests"]) == 5
    assert [len(r["token_ids"]) for r in real["requests"]] == [o for _, _, o in ROWS]
    assert [r["hash_ids"] for r in twin["requests"]] == [[i, i + 1] for i in range(len(ROWS))]
