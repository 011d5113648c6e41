"""How the scheduler scales with the queue: an overloaded open-loop workload, 2k and 10k requests.

Open-loop Poisson at about twice slice mode's capacity (30% speculative, batch 32, 64
KV slots), so the queue grows for the whole run. Each benchmark runs the whole
`coopsched run PATH --mode slice --json OUT` command in a child process and reads that
child's own CPU time (os.wait4) and the peak RSS it reports of itself (VmHWM). Benchmarks report, tests assert: the
figures go in `extra_info` and the trends, never in a timed assertion; what is asserted
is that the run happened (every request served, tokens counted).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench
WORKLOADS = Path(__file__).resolve().parent / "workloads"
SCALE: dict[int, float] = {}  # requests -> CPU us per output token, for the 10k/2k ratio


# `coopsched run` in a child that reports its own peak RSS: wait4's ru_maxrss also counts the pytest
# parent's pages the child held between fork and exec (~600 MB under tox), VmHWM only what exec gave it
CHILD = """import resource, sys
from coopsched.cli import main
code = main(sys.argv[1:])
try:
    with open("/proc/self/status") as status:
        kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
except OSError:  # no /proc (macOS: ru_maxrss in bytes)
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
print("peak_rss_kb", kb, file=sys.stderr)
sys.exit(code)"""


def run_command(workload: Path, out: Path) -> dict:
    """The whole command in a child process: its CPU seconds, peak RSS and output tokens."""
    errors = out.with_suffix(".stderr")
    with errors.open("w") as sink:
        child = subprocess.Popen([sys.executable, "-c", CHILD, "run", str(workload), "--mode", "slice",
                                  "--json", str(out)], stdout=subprocess.DEVNULL, stderr=sink)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == 0, errors.read_text()[-2000:]
    (trace,) = json.loads(out.read_text())
    peak_kb = int(errors.read_text().split()[-1])
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mb": peak_kb / 1024,
            "requests": len(trace["requests"]), "tokens": sum(len(r["token_ids"]) for r in trace["requests"])}


@pytest.mark.benchmark(group="scale", min_rounds=1, max_time=0)
@pytest.mark.parametrize("num", [2000, 10000], ids=["2k", "10k"])
def test_overloaded_open_loop(benchmark, tmp_path, num):
    workload = WORKLOADS / f"overload-{num // 1000}k.toml"
    figures = benchmark.pedantic(run_command, args=(workload, tmp_path / "trace.json"), rounds=1, iterations=1)
    assert figures["requests"] == num and figures["tokens"] > num
    us_per_token = 1e6 * figures["cpu_s"] / figures["tokens"]
    SCALE[num] = us_per_token
    benchmark.extra_info.update(
        kind="scale", workload=workload.stem, **figures, tokens_per_cpu_s=round(figures["tokens"] / figures["cpu_s"]),
        cpu_us_per_token=round(us_per_token, 2),
        per_token_vs_2k=round(us_per_token / SCALE[2000], 3) if 2000 in SCALE else None)
