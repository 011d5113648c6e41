"""The stored bench runs: pytest-benchmark's own files under reports/benchmarks/, read back.

`pytest -m bench --benchmark-storage=reports/benchmarks --benchmark-autosave`
(what `tox -e bench` runs) saves one `<machine>/<NNNN>_<commit>_<date>.json` per
run. Each holds, per benchmark, its timing stats and the `extra_info` the bench
suite filled: the tracked virtual-time metrics per scenario x mode (kind
"scenario") and the wall-time figures (kind "tick", "scenario", "scale").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.report.gate import TRACKED

DEFAULT_STORAGE = Path("reports") / "benchmarks"


@dataclass
class StoredRun:
    path: Path
    number: int                  # pytest-benchmark's counter
    commit: str
    dirty: bool
    datetime: str                # ISO, UTC
    tracked: dict = field(default_factory=dict)  # {scenario: {mode: {metric: value}}}
    wall: dict = field(default_factory=dict)     # {figure name: value}, reported never gated

    @property
    def label(self) -> str:
        dirty = "+" if self.dirty else ""
        return f"#{self.number} {self.commit[:7]}{dirty}\n{self.datetime[5:16].replace('T', ' ')}"


def _parse(path: Path) -> StoredRun:
    data = json.loads(path.read_text())
    commit = data.get("commit_info", {})
    number = int(path.name.split("_", 1)[0]) if path.name[:4].isdigit() else 0
    run = StoredRun(path, number, str(commit.get("id", "unknown")), bool(commit.get("dirty")),
                    str(data.get("datetime", "")))
    sums: dict[str, list[float]] = {}  # scenario -> [tokens, cpu s, virtual ms, wall ms] over its modes
    for bench in data.get("benchmarks", []):
        extra, stats = bench.get("extra_info", {}), bench.get("stats", {})
        kind = extra.get("kind")
        if kind == "scenario":
            run.tracked.setdefault(extra["scenario"], {})[extra["mode"]] = {
                m.name: extra.get(m.name) for m in TRACKED}
            acc = sums.setdefault(extra["scenario"], [0.0, 0.0, 0.0, 0.0])
            for i, value in enumerate((extra.get("tokens"), extra.get("cpu_s"), extra.get("virtual_ms"),
                                       stats.get("mean", 0.0) * 1e3)):
                acc[i] += value or 0.0
        elif kind == "tick":
            run.wall[f"tick us: B={extra['batch_size']}"] = stats.get("mean", 0.0) * 1e6
        elif kind == "scale":  # the whole `coopsched run` command on an overloaded workload
            run.wall[f"tokens per CPU-s: {extra['workload']} (whole command)"] = extra.get("tokens_per_cpu_s")
            run.wall[f"peak RSS MB: {extra['workload']}"] = extra.get("peak_rss_mb")
    for name, (tokens, cpu_s, virtual_ms, wall_ms) in sorted(sums.items()):
        run.wall[f"tokens per CPU-s: {name}"] = tokens / cpu_s if cpu_s else None
        run.wall[f"virtual/wall: {name}"] = virtual_ms / wall_ms if wall_ms else None
    return run


def load_runs(storage: Path = DEFAULT_STORAGE) -> list[StoredRun]:
    """Every stored run, oldest first (by date, then counter)."""
    storage = Path(storage)
    if not storage.is_dir():
        return []
    runs = []
    for path in storage.glob("*/[0-9][0-9][0-9][0-9]_*.json"):
        try:
            runs.append(_parse(path))
        except (OSError, ValueError, KeyError):
            continue  # a foreign or half-written file is not a run
    return sorted(runs, key=lambda r: (r.datetime, r.number))
