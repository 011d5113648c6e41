"""Factories with small defaults: a test overrides only the knob it is about."""

from __future__ import annotations

from collections.abc import Callable

from coopsched.cli import main as cli
from coopsched.clock import ManualClock
from coopsched.core import Request, SamplingParams, Scheduler, SchedulerConfig
from coopsched.engine import Engine
from mocks import CostModel, MockBackend, MockDrafter, MockTarget


def make_backend(clock=None, *, cost: CostModel | None = None, accept_prob: float = 0.7,
                 scripts: dict | None = None, target: MockTarget | None = None, seed: int = 0) -> MockBackend:
    return MockBackend(clock or ManualClock(), cost or CostModel(), target or MockTarget(),
                       MockDrafter(accept_prob, seed=seed, scripts=scripts))


def make_engine(backend=None, **overrides) -> Engine:
    """A scheduler with `overrides` on a mock backend, in the backend's (virtual) time."""
    backend = backend or make_backend()
    return Engine(Scheduler(SchedulerConfig(**overrides)), backend, backend.clock)


def make_requests(n: int, prompt_len: int = 8, max_tokens: int = 16, prefix: str = "r", **kwargs) -> list[Request]:
    return [Request(f"{prefix}{i}", tuple(65 + (i + j) % 26 for j in range(prompt_len)), max_tokens, **kwargs)
            for i in range(n)]


def mixed_requests(speculative: bool) -> list[Request]:
    """Two classic rows, three same-shape speculative candidates arriving together, one seeded sample."""
    classic = make_requests(2, prompt_len=6, max_tokens=50, prefix="c", speculative=False)
    spec = make_requests(3, prompt_len=9, max_tokens=37, prefix="s", speculative=speculative)
    seeded = Request("t", (1, 2, 3, 4), 30, SamplingParams(0.9, 7), speculative=speculative)
    for r in spec + [seeded]:
        r.arrival_ms = 10.0
    return classic + spec + [seeded]


def serve_both_ways(make: Callable[[], Engine]) -> tuple[dict, dict, Scheduler, object]:
    """Outputs of mixed_requests with speculation on and forced off; the speculative run's scheduler and result."""
    outputs, spec_run = {}, None
    for speculative in (True, False):
        engine = make()
        requests = mixed_requests(speculative)
        result = engine.run(requests)
        outputs[speculative] = {r.id: (r.output_token_ids, r.finish_reason) for r in requests}
        if speculative:
            spec_run = (engine.scheduler, result)
    return outputs[True], outputs[False], *spec_run


def token_times(result) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    for event in result.events:
        times.setdefault(event.seq_id, []).extend([event.time_ms] * len(event.token_ids))
    return times


def mixed_workload(num_requests: int = 30, **extra: object) -> str:
    """poisson-mix's shape as a scenario file: Poisson at 8/s, mixed lengths, 30% speculative."""
    lines = [f"{key} = {value}" for key, value in extra.items()]
    return "\n".join(["[workload]", f"num_requests = {num_requests}", 'arrival = "poisson"', "rate_per_s = 8",
                      "prompt_len = { min = 8, max = 96 }", "max_tokens = { mean = 40, sigma = 0.6 }",
                      "speculative_share = 0.3", *lines]) + "\n"


# a short closed-loop ladder for live sweeps: 8 requests, half speculative (`--concurrency` sets the users)
LADDER = """
[workload]
num_requests = 8
arrival = "closed"
concurrency = 1
prompt_len = 16
max_tokens = 24
speculative_share = 0.5
"""


def cli_error_line(capsys, argv: list[str]) -> str:
    """`coopsched ARGV` refuses with exit 2 and exactly one `error: ...` line, no traceback."""
    assert cli(argv) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    return lines[0]
