"""The twin seam: a server kind's model plans steps, the generic commit books them.

A small model here (every admitted row in one forward, up to `max_rows`) stands in for a kind's:
its greedy tokens must equal coopsched's reference scheduler's, its KV books must balance, a
cancel and a failed call must end only their rows, and its parameters are checked by name.
"""

from __future__ import annotations

import json

import pytest
from factories import make_backend, make_requests, mixed_requests

from coopsched import twins
from coopsched.clock import ManualClock
from coopsched.core import ActionKind, Plan, Scheduler, SchedulerConfig, TickKind, Verify
from coopsched.engine import Engine
from coopsched.executor import BackendError
from coopsched.twins import Param, StepModel, make_scheduler
from coopsched.twins.base import is_prefilled
from harness.run import runner, scenario


class EveryRow(StepModel):
    """Admit up to `max_rows`; prefill what is not prefilled, then decode (or verify K) every other row."""
    kind = "every-row"
    PARAMS = (Param("max_rows", 4, "--max-rows", "rows served together"),)

    def plan_step(self) -> Plan:
        for request in list(self.waiting):
            if len(self.running) < self.params["max_rows"] and self.kv.num_free:
                self.admit(request)
        prefills = tuple(self.span(r) for r in self.running if not is_prefilled(r))
        ready = [r for r in self.running if is_prefilled(r)]
        if not prefills and not ready:
            return self.idle_plan()
        ids = tuple(r.id for r in self.running)
        if self.speculates:
            k = self.config.block_size
            verifies = tuple(Verify(r.id, r.last_token, k) for r in ready)  # type: ignore[arg-type]
            return Plan(ActionKind.FUSED, TickKind.FUSED, self.state(), ids, prefills, (), verifies)
        decodes = tuple((r.id, r.last_token) for r in ready)
        return Plan(ActionKind.MIXED, TickKind.MIXED, self.state(), ids, prefills, decodes)  # type: ignore[arg-type]


def served(scheduler, requests, backend=None):
    backend = backend or make_backend()
    events = []
    Engine(scheduler, backend, backend.clock, on_event=events.append).run(requests)
    return backend, events


@pytest.mark.parametrize("drafter", [False, True])
def test_a_model_serves_the_reference_tokens(drafter):
    config = SchedulerConfig(has_drafter=drafter)
    reference = mixed_requests(speculative=True)
    served(Scheduler(config), reference)
    ours = mixed_requests(speculative=True)
    model = EveryRow(config, {"max_rows": 3})
    backend, _ = served(model, ours)
    assert [r.output_token_ids for r in ours] == [r.output_token_ids for r in reference]
    assert all(r.finish_reason is not None for r in ours)
    assert backend.num_live == 0 and model.kv.num_in_use == 0 and not model.requests
    assert (model.obs.rounds > 0) == drafter and all(r.served_speculatively == drafter for r in ours)
    assert model.obs.accepted_tokens <= model.obs.drafted_tokens


def test_the_row_cap_is_the_models_and_changes_who_waits():
    """max_rows=1 serves one request at a time: the second's first token comes after the first finished."""
    def ttft_after_first_finished(max_rows):
        requests = make_requests(2, max_tokens=8)
        _, events = served(EveryRow(SchedulerConfig(has_drafter=False), {"max_rows": max_rows}), requests)
        first_done = next(e.time_ms for e in events if e.seq_id == "r0" and e.finish_reason)
        second_first = next(e.time_ms for e in events if e.seq_id == "r1" and e.token_ids)
        return second_first >= first_done
    assert ttft_after_first_finished(1)
    assert not ttft_after_first_finished(2)


def test_a_cancel_ends_its_row_and_frees_its_cache():
    backend = make_backend()
    model = EveryRow(SchedulerConfig(has_drafter=False))
    engine = Engine(model, backend, backend.clock)
    for request in make_requests(2, max_tokens=30):
        model.submit(request)
    for _ in range(4):
        engine.step()
    model.cancel("r0")
    committed = engine.step()
    assert [(e.seq_id, e.finish_reason.value) for e in committed.events if e.finish_reason] == [("r0", "stop")]
    assert "r0" in committed.releases and not model.kv.holds("r0")
    while model.has_work:
        engine.step()
    assert backend.num_live == 0 and len(model.requests) == 0


class FailsFor:
    """A mock backend whose decode fails for one row (and only says so for it)."""

    def __init__(self, backend, seq_id):
        self._backend, self._seq_id = backend, seq_id

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def decode(self, rows):
        if any(seq_id == self._seq_id for seq_id, _ in rows):
            raise BackendError("planted decode failure", (self._seq_id,))
        return self._backend.decode(rows)


def test_a_failed_call_ends_only_its_rows():
    inner = make_backend()
    backend = FailsFor(inner, "r1")
    requests = make_requests(2, max_tokens=6)
    model = EveryRow(SchedulerConfig(has_drafter=False))
    Engine(model, backend, inner.clock).run(requests)
    assert [r.finish_reason.value for r in requests] == ["length", "error"]
    assert requests[1].error == "planted decode failure" and model.kv.num_in_use == 0


def test_parameters_and_kinds_are_checked_by_name():
    with pytest.raises(ValueError, match=r"'max_row' unknown for a every-row server; accepted: max_rows"):
        EveryRow(SchedulerConfig(), {"max_row": 2})
    with pytest.raises(ValueError, match=r"server kind 'sglang': want one of coopsched, vllm, mlx-lm, llama.cpp"):
        make_scheduler("sglang", SchedulerConfig())
    with pytest.raises(ValueError, match=r"a coopsched twin runs coopsched's scheduler"):
        make_scheduler("coopsched", SchedulerConfig(), {"max_num_seqs": 8})
    assert isinstance(make_scheduler("unknown", SchedulerConfig()), Scheduler)
    assert isinstance(make_scheduler("coopsched", SchedulerConfig(), {"frontend_ms": 3.0}), Scheduler)
    with pytest.raises(ValueError, match=r"frontend_ms=-1: a coopsched twin wants a number of ms >= 0"):
        make_scheduler("coopsched", SchedulerConfig(), {"frontend_ms": -1})


def test_the_references_frontend_delays_each_first_token_and_nothing_else():
    """coopsched serve's HTTP layer, outside the engine: the scheduler sees every open-loop arrival
    frontend_ms later, and each TTFT counts from the client's send."""
    from harness.calibrate import heldout, twin
    from mocks import CostModel

    cost, config, scen = CostModel.simple(2.0, 8.0, 0.1), twin.twin_config("slice"), heldout.workload(20.0, 12)
    runs = [twin.simulate_timed(runner.Profile(cost, "coopsched", params), config, scen, heldout.SEED)
            for params in ({}, {"frontend_ms": 3.0})]
    for plain, shifted in zip(*runs):
        assert shifted.arrival_ms == plain.arrival_ms
        assert shifted.token_times_ms == pytest.approx([t + 3.0 for t in plain.token_times_ms])


def test_a_profile_picks_the_model_and_the_run_skips_coopscheds_bounds(tmp_path, monkeypatch):
    monkeypatch.setitem(twins._MODELS, "vllm", "test_twin_seam:EveryRow")
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"decode_ms": [[1, 3.0]], "server": "vllm", "server_params": {"max_rows": 2}}))
    profile = runner.Profile.load(path)
    scen = runner.priced(scenario.load("concurrency2"), profile)
    trace = runner.run_scenario(scen, "slice")
    checks = {c["name"]: c for c in trace["checks"]}
    assert checks["kv_released"]["ok"] is True
    assert all(c["skipped"] and "the twin of a vllm server" in c["note"]
               for name, c in checks.items() if name != "kv_released")
    assert all(r["finish_reason"] for r in trace["requests"])
    path.write_text(json.dumps({"server": "vllm", "server_params": {"max_num_seqz": 2}}))
    with pytest.raises(ValueError, match="max_num_seqz"):
        runner.Profile.load(path)
    path.write_text(json.dumps({"server": "unknown"}))
    assert "coopsched's own scheduler" in runner.Profile.load(path).note


def test_the_seam_is_the_clock_free_engine_surface():
    """The engine runs a model on the virtual clock exactly as it runs the reference (no clock read)."""
    clock = ManualClock()
    backend = make_backend(clock)
    model = EveryRow(SchedulerConfig(has_drafter=False))
    Engine(model, backend, clock).run(make_requests(3, max_tokens=4))
    assert clock.now() > 0 and model.is_idle and not model.has_work
