"""Run one scenario in one mode and turn it into the trace JSON (README: "The trace JSON").

`execute` runs the engine (virtual clock and mock by default, or any backend
factory with a real clock) and records every token's visibility time;
`run_scenario` adds the reference runs the checks need (speculation forced
off for parity, the legacy burst for the burst_wall ratio) and the checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from coopsched.clock import ManualClock
from coopsched.core import ModelBackend, Request, Scheduler, SchedulerConfig, TickRecord
from coopsched.engine import Engine
from coopsched.env import Gates
from harness.run import metrics
from harness.run.scenario import Scenario
from mocks import CostModel, MockBackend, MockDrafter, MockTarget

BackendFactory = Callable[[object, Scenario, int], ModelBackend]  # (clock, scenario, seed) -> backend
DEFAULT_ACCEPT_PROB = 0.7


@dataclass
class Run:
    scenario: Scenario
    config: SchedulerConfig
    cost: CostModel | None
    clock_kind: str
    requests: list[Request]
    token_times: dict[str, list[float]]
    ticks: list[TickRecord]
    scheduler: Scheduler
    backend: ModelBackend
    extra: dict = field(default_factory=dict)
    _index: dict = field(default_factory=dict, repr=False)

    def by_id(self, seq_id: str) -> Request:
        if len(self._index) != len(self.requests):
            self._index.update((r.id, r) for r in self.requests)
        return self._index[seq_id]


def mock_backend(clock, scenario: Scenario, seed: int, profile: CostModel | None = None) -> MockBackend:
    """The mock priced by the scenario's costs over `profile`; its drafter accepts with the
    scenario's accept_prob, else the profile's measured one, else 0.7."""
    mock = scenario.mock
    cost = scenario_cost(scenario, seed, profile)
    scripts = {r.id: list(r.accept_script) for r in scenario.requests if r.accept_script}
    target = MockTarget(eos_rate=mock.get("eos_rate", 0.0))
    fallback = DEFAULT_ACCEPT_PROB if cost.accept_prob is None else cost.accept_prob
    drafter = MockDrafter(mock.get("accept_prob", fallback), seed=seed, scripts=scripts)
    return MockBackend(clock, cost, target, drafter)


def priced(scenario: Scenario, profile: CostModel) -> Scenario:
    """The scenario with a cost profile under its own [cost] keys (which still win), so it carries
    its prices wherever it goes (a sweep ships it to worker processes)."""
    return replace(scenario, cost={**profile.to_json(), **scenario.cost})


def scenario_cost(scenario: Scenario, seed: int, profile: CostModel | None = None) -> CostModel:
    if profile is not None:
        scenario = priced(scenario, profile)
    return CostModel(**{**scenario.cost, "seed": seed})


def scenario_config(scenario: Scenario, mode: str | None, options: dict | None = None) -> SchedulerConfig:
    """Gates (environment over the scenario's defaults), then the scenario's knobs, then --mode
    and other command-line options (e.g. hol_budget_ms from --hol-budget-ms)."""
    overrides = dict(scenario.scheduler) | dict(options or {})
    if mode is not None:
        overrides["mode"] = mode
    return Gates.from_env(scenario.gates).scheduler_config(**overrides)


def gate_warnings(scenarios: Iterable[Scenario]) -> list[str]:
    """What the gates kept a default for (an unparseable value), once each, for these scenarios."""
    return list(dict.fromkeys(w for s in scenarios for w in Gates.from_env(s.gates).warnings))


def execute(scenario: Scenario, config: SchedulerConfig, seed: int = 0, *,
            speculative: bool | None = None, backend_factory: BackendFactory = mock_backend,
            clock=None) -> Run:
    clock = clock or ManualClock()
    backend = reports_live_caches(backend_factory(clock, scenario, seed))
    scheduler = Scheduler(config)
    requests = scenario.build_requests(seed, speculative)
    token_times: dict[str, list[float]] = {r.id: [] for r in requests}

    def record(event) -> None:
        token_times[event.seq_id].extend([event.time_ms] * len(event.token_ids))

    result = Engine(scheduler, backend, clock, on_event=record).run(scenario.arrivals(requests), keep_events=False)
    return Run(scenario, config, getattr(backend, "cost", None), clock.kind, requests,
               token_times, result.ticks, scheduler, backend)


def reports_live_caches(backend: ModelBackend) -> ModelBackend:
    """The backend, if it reports `num_live` (the protocol asks it): without it `kv_released`
    could not tell a freed cache from a leaked one, so the run is refused rather than passed."""
    live = getattr(backend, "num_live", None)
    if not isinstance(live, int) or isinstance(live, bool):
        raise ValueError(f"backend {type(backend).__name__} reports no num_live (got {live!r}): "
                         "kv_released needs the count of sequences holding caches (ModelBackend.num_live)")
    return backend


def _ms(x: float) -> float:
    return round(x, 6)


def to_trace(run: Run, checks: list[dict], seed: int) -> dict:
    requests = []
    hashes = {s.id: list(s.hash_ids) for s in run.scenario.specs(seed) if s.hash_ids is not None}  # a replay's
    for r in run.requests:
        times = run.token_times[r.id]
        requests.append({
            "id": r.id, "speculative": r.served_speculatively, "eligible": r.speculative,
            "prompt_token_ids": list(r.prompt_token_ids), "token_ids": list(r.output_token_ids),
            "token_times_ms": [_ms(t) for t in times], "arrival_ms": _ms(r.arrival_ms),
            "finish_reason": r.finish_reason.value if r.finish_reason else None,
            "metrics": {k: (_ms(v) if isinstance(v, float) else v)
                        for k, v in metrics.request_metrics(r.arrival_ms, times).items()},
            **({"hash_ids": hashes[r.id]} if r.id in hashes else {}),
        })
    obs = run.scheduler.obs
    return {
        "scenario": run.scenario.name, "mode": run.config.mode, "clock": run.clock_kind, "seed": seed,
        "requests": requests,
        "ticks": [{**t.to_json(), "start_ms": _ms(t.start_ms), "end_ms": _ms(t.end_ms)} for t in run.ticks],
        "bursts": [{k: (_ms(v) if isinstance(v, float) else v) for k, v in b.to_json().items()}
                   for b in obs.bursts],
        "checks": checks,
        "observability": {
            "rounds": obs.rounds, "drafted_tokens": obs.drafted_tokens,
            "accepted_tokens": obs.accepted_tokens, "slices": obs.slices,
            "hol_waiters_max": obs.hol_waiters_max, "waiter_parks": obs.waiter_parks,
            "hol_wait_ms": metrics.weighted_percentiles(obs.hol_wait_ms), "grant_log": list(obs.grant_log),
        },
        "throughput": metrics.throughput(requests),
        **run.extra,
    }


def run_scenario(scenario: Scenario, mode: str | None = None, seed: int = 0, *,
                 backend_factory: BackendFactory = mock_backend, clock_factory=ManualClock,
                 options: dict | None = None) -> dict:
    """The trace of one scenario x mode, with its checks evaluated."""
    from harness.verdict.virtual import evaluate

    config = scenario_config(scenario, mode, options)
    run = execute(scenario, config, seed, backend_factory=backend_factory, clock=clock_factory())
    classic = burst = None
    if scenario.runs_reference("parity"):
        classic = execute(scenario, config, seed, speculative=False, backend_factory=backend_factory,
                          clock=clock_factory())
    if config.mode != "burst" and scenario.runs_reference("vs_burst"):
        burst = execute(scenario, config.with_(mode="burst"), seed, backend_factory=backend_factory,
                        clock=clock_factory())
    return to_trace(run, [c.to_json() for c in evaluate(run, classic=classic, burst=burst)], seed)
