"""KV slot pool, prefill queue lanes, stop rules and HOL accounting."""

import pytest
from factories import make_backend, make_engine, make_requests

from coopsched.core import FinishReason, Priority, Request, RequestError, SamplingParams, Scheduler, SchedulerConfig
from coopsched.core.append import append_tokens
from coopsched.core.kv import KVSlotPool
from coopsched.core.queue import PrefillQueue
from coopsched.engine import Engine
from mocks import ByteTokenizer

EOS = ByteTokenizer.eos_token_id


class Vocab:
    eos_token_id = EOS
    detokenize = staticmethod(ByteTokenizer().decode)


def test_request_that_can_never_fit_is_refused_with_the_numbers():
    scheduler = make_engine(slot_tokens=32).scheduler
    with pytest.raises(RequestError, match=r"needs 40 tokens .*prompt 8 \+ max_tokens 32.* holds 32"):
        scheduler.submit(make_requests(1, prompt_len=8, max_tokens=32)[0])


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_tokens=0), "max_tokens=0 must be >= 1"),
    (dict(max_tokens=4, sampling=SamplingParams(-1.0)), "temperature=-1.0 must be >= 0"),
])
def test_bad_requests_name_the_value(kwargs, match):
    with pytest.raises(RequestError, match=match):
        Request("r", (1,), **kwargs)


def test_empty_prompt_is_refused():
    with pytest.raises(RequestError, match="prompt is empty"):
        make_engine().scheduler.submit(Request("r", (), 4))


def test_admission_waits_while_the_pool_is_full():
    engine = make_engine(num_kv_slots=2)
    scheduler = engine.scheduler
    requests = make_requests(5, max_tokens=6, speculative=False)
    in_use = []
    engine.on_tick = lambda committed: in_use.append(scheduler.kv.num_in_use)
    result = engine.run(requests)
    assert max(in_use) == 2 and scheduler.kv.num_in_use == 0
    first_finish = min(e.time_ms for e in result.events if e.finish_reason is not None)
    third_admit = [t.start_ms for t in result.ticks if t.kind.detail == "admit"][2]
    assert third_admit >= first_finish  # the third request waited for a slot to free
    assert all(r.finish_reason is FinishReason.LENGTH for r in requests)


def test_pool_accounting():
    pool = KVSlotPool(2, 16)
    pool.acquire("a")
    with pytest.raises(RuntimeError, match="already holds"):
        pool.acquire("a")
    pool.acquire("b")
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.acquire("c")
    pool.release("a")
    pool.release("a")  # idempotent
    assert (pool.num_in_use, pool.num_free) == (1, 1)


def test_queue_lanes_are_fifo_within_priority():
    queue = PrefillQueue()
    for name, priority in [("n1", Priority.NORMAL), ("l1", Priority.LOW), ("h1", Priority.HIGH),
                           ("n2", Priority.NORMAL), ("h2", Priority.HIGH)]:
        queue.push(Request(name, (1,), 1, priority=priority))
    assert [queue.pop().id for _ in range(5)] == ["h1", "h2", "n1", "n2", "l1"]


@pytest.mark.parametrize("tokens, max_tokens, stop, committed, reason", [
    pytest.param([ord("a"), ord("b")], 2, ("b",), [97, 98], FinishReason.STOP, id="stop-string-beats-budget"),
    pytest.param([ord("a"), EOS], 1, (), [97], FinishReason.LENGTH, id="budget-cuts-before-eos"),
    pytest.param([ord("a"), EOS], 2, (), [97], FinishReason.STOP, id="eos-within-budget"),
    pytest.param([ord("a"), ord("b")], 5, (), [97, 98], None, id="unfinished"),
])
def test_finish_ranking(tokens, max_tokens, stop, committed, reason):
    request = Request("r", (1,), max_tokens, stop=stop)
    assert append_tokens(request, tokens, Vocab()) == (committed, reason)


def test_hol_waiters_is_the_true_maximum():
    from harness.run import runner, scenario
    scen = scenario.load("many-classic")
    burst = runner.execute(scen, runner.scenario_config(scen, "burst"))
    assert burst.scheduler.obs.bursts[0].hol_waiters == 8 == burst.scheduler.obs.hol_waiters_max
    sliced = runner.execute(scen, runner.scenario_config(scen, "slice"))
    waits = sliced.scheduler.obs.hol_wait_ms
    assert waits and max(waits) == pytest.approx(max(runner.scenario_cost(scen, 0).slice0(48) + 20.0, 20.0))


MID_BURST = """
[[requests]]
id = "c0"
max_tokens = 40
speculative = false

[[requests]]
id = "spec"
arrival_ms = 12
prompt_len = 32
max_tokens = 40

[[requests]]
id = "c1"
arrival_ms = 100
max_tokens = 20
speculative = false
"""


def test_a_request_that_arrives_during_a_burst_waits_from_its_arrival(tmp_path):
    """c1 arrives 100 ms in, during the legacy burst: it waited on it from then (not from the burst's
    end, when the engine first takes it), and the burst's hol_waiters counts it."""
    from harness.run import runner, scenario
    path = tmp_path / "mid-burst.toml"
    path.write_text(MID_BURST)
    scen = scenario.load(str(path))
    run = runner.execute(scen, runner.scenario_config(scen, "burst"))
    burst = next(t for t in run.ticks if t.kind.value == "burst")
    assert burst.start_ms < 100 < burst.end_ms
    waits = run.scheduler.obs.hol_wait_ms
    assert sorted(waits) == [pytest.approx(burst.end_ms - 100), pytest.approx(burst.wall_ms)]  # c1's, c0's
    assert run.scheduler.obs.bursts[0].hol_waiters == 2 == run.scheduler.obs.hol_waiters_max


def test_a_server_scheduler_keeps_no_history_so_nothing_grows_with_requests():
    """keep_history=False (the server's): each tick's HOL waits travel in its deltas and none piles up in
    the books, where on a real clock every wait would be a new key (a soak grew 1 MB a minute)."""
    backend = make_backend()
    exported: list[tuple[float, int]] = []
    engine = Engine(Scheduler(SchedulerConfig(), keep_history=False), backend, backend.clock,
                    on_tick=lambda committed: exported.extend(committed.deltas.hol_waits))
    engine.run(make_requests(4, speculative=False) + make_requests(2, prefix="s", max_tokens=24))
    obs = engine.scheduler.obs
    assert exported and obs.rounds > 0
    assert not obs.hol_wait_ms and not obs.bursts and not obs.grant_log
