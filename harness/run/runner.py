"""Run one scenario in one mode and turn it into the trace JSON (README: "The trace JSON").

`execute` runs the engine (virtual clock and mock by default, or any backend
factory with a real clock) and records every token's visibility time;
`run_scenario` adds the reference runs the checks need (speculation forced
off for parity, the legacy burst for the burst_wall ratio) and the checks.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from coopsched.clock import ManualClock
from coopsched.core import ModelBackend, Request, Scheduler, SchedulerConfig, TickRecord
from coopsched.engine import Engine
from coopsched.env import Gates
from coopsched.twins import KINDS, UNKNOWN, StepModel, make_scheduler, model_class, reference_params
from harness.run import metrics
from harness.run.scenario import Scenario
from harness.run.shared_core import BusyClock, FrontendArrivals, SharedCoreClock, wake_charge
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
    scheduler: Scheduler | StepModel
    backend: ModelBackend
    extra: dict = field(default_factory=dict)
    _index: dict = field(default_factory=dict, repr=False)

    def by_id(self, seq_id: str) -> Request:
        if len(self._index) != len(self.requests):
            self._index.update((r.id, r) for r in self.requests)
        return self._index[seq_id]


@dataclass(frozen=True)
class Profile:
    """A calibrated twin: the mock's costs, and the server kind whose scheduler the twin runs
    (`"server"`, with `"server_params"`, in the profile JSON; absent: coopsched's own)."""
    cost: CostModel
    server: str = "coopsched"
    server_params: Mapping[str, object] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        cost = CostModel.load(path)  # says which file when it cannot be read
        data = json.loads(Path(path).read_text())
        server, params = data.get("server", "coopsched"), data.get("server_params") or {}
        if server not in (*KINDS, UNKNOWN) or not isinstance(params, dict):
            raise ValueError(f"cost profile {path}: server={server!r} server_params={params!r}; want server one "
                             f"of {', '.join((*KINDS, UNKNOWN))} and server_params an object")
        try:  # an unknown parameter is refused here, naming the file
            model_class(server).resolve(params) if server not in ("coopsched", UNKNOWN) else \
                reference_params(server, params)
        except ValueError as exc:
            raise ValueError(f"cost profile {path}: {exc}") from None
        return cls(cost, server, params)

    @property
    def note(self) -> str | None:
        """What a user must be told about the twin this profile runs, if anything."""
        if self.server == UNKNOWN:
            return ("the profile's server kind is unknown: its twin runs coopsched's own scheduler at the "
                    "calibrated costs (calibrate --server KIND names the kind)")
        return None


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


def priced(scenario: Scenario, profile: CostModel | Profile) -> Scenario:
    """The scenario with a cost profile under its own [cost] keys (which still win), and a twin's
    server kind, so it carries both wherever it goes (a sweep ships it to worker processes)."""
    if isinstance(profile, Profile):
        server = {"kind": profile.server, **profile.server_params}
        return replace(priced(scenario, profile.cost), server=server)
    return replace(scenario, cost={**profile.to_json(), **scenario.cost})


def server_kind(scenario: Scenario) -> str:
    return str(scenario.server.get("kind", "coopsched"))


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


DRAW_STRIDE = 7919  # a twin's draw d prices and accepts with the seed + d x this (its requests keep the seed's)


def execute(scenario: Scenario, config: SchedulerConfig, seed: int = 0, *,
            speculative: bool | None = None, backend_factory: BackendFactory = mock_backend,
            clock=None, draw: int = 0) -> Run:
    """One run of `scenario` under `config`: its requests drawn by `seed`, and, for `draw` > 0, the
    backend's costs and acceptance (and a step model's own draws) drawn anew over the same requests."""
    clock = clock or ManualClock()
    kind, params = server_kind(scenario), {k: v for k, v in scenario.server.items() if k != "kind"}
    scheduler = make_scheduler(kind, config, params)
    if isinstance(scheduler, StepModel):
        scheduler.draw = draw
    requests = scenario.build_requests(seed, speculative)
    arrivals = scenario.arrivals(requests)
    open_loop = isinstance(arrivals, list)
    twin = scheduler if isinstance(scheduler, StepModel) and open_loop else None
    # the frontend's work on the engine's core, from each send
    stall = frontend_param(scheduler, kind, params, "frontend_stall_ms") if open_loop else 0.0
    charged = SharedCoreClock(clock, [r.arrival_ms for r in requests], stall) if stall else clock
    busy = twin.frontend_busy_ms if twin else 0.0  # more frontend for a request sent while the engine is in a step
    cold = twin.idle_wake if twin else ()  # ... or after the engine sat idle a while
    steps = BusyClock(charged) if busy or cold else None  # when the engine was in a step, for the frontends
    charged = steps or charged
    backend = reports_live_caches(backend_factory(charged, scenario, seed + DRAW_STRIDE * draw))
    token_times: dict[str, list[float]] = {r.id: [] for r in requests}

    def record(event) -> None:
        token_times[event.seq_id].extend([event.time_ms] * len(event.token_ids))

    frontend = frontend_param(scheduler, kind, params, "frontend_ms") if open_loop else 0.0
    sends = {r.id: r.arrival_ms for r in requests}
    for request in requests if frontend else ():  # open loop: each reaches the scheduler that much later ...
        request.arrival_ms += frontend
    if steps:
        arrivals = FrontendArrivals(requests, sends, steps, busy, cold)
    try:
        wake = twin.wake_ms if twin else 0.0  # each streamed token's wake of the other requests' HTTP threads
        on_tick = wake_charge(scheduler, charged, wake) if wake else None
        result = Engine(scheduler, backend, clock, on_event=record, on_tick=on_tick).run(arrivals, keep_events=False)
    finally:
        for request in requests if frontend or steps else ():  # ... and its TTFT counts from when the client sent it
            request.arrival_ms = sends[request.id]  # (a closed loop's arrivals are set as it runs: kept)
    return Run(scenario, config, getattr(backend, "cost", None), clock.kind, requests,
               token_times, result.ticks, scheduler, backend)


def frontend_param(scheduler: Scheduler | StepModel, kind: str, params: Mapping[str, object], name: str) -> float:
    """A frontend param of a kind's model, or of the reference's params: `frontend_ms`, from a
    client's send to the twin's scheduler seeing the request (the runner shifts open-loop arrivals by
    it), or `frontend_stall_ms`, the engine's core each send takes (SharedCoreClock)."""
    if isinstance(scheduler, StepModel):
        return float(getattr(scheduler, name))
    return reference_params(kind, params)[name]


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
    if server_kind(scenario) not in ("coopsched", UNKNOWN):  # coopsched's bounds are for coopsched's scheduler
        from harness.verdict.virtual import evaluate_other_server
        return to_trace(run, [c.to_json() for c in evaluate_other_server(run, server_kind(scenario))], seed)
    classic = burst = None
    if scenario.runs_reference("parity"):
        classic = execute(scenario, config, seed, speculative=False, backend_factory=backend_factory,
                          clock=clock_factory())
    if config.mode != "burst" and scenario.runs_reference("vs_burst"):
        burst = execute(scenario, config.with_(mode="burst"), seed, backend_factory=backend_factory,
                        clock=clock_factory())
    return to_trace(run, [c.to_json() for c in evaluate(run, classic=classic, burst=burst)], seed)

