"""Slot rotation: grant logs pinned for G = 1, 2, 8 with two and three contenders.

With G = 1 or 2 the third contender finds the backlog at its cap (an expired job
parks before the next grant) and is served classically: pinned, as upstream.

Log entries: "x" = x granted the slot (slice 0 or a resumed job); "park:x" = x's
grant expired and it went to the back of the backlog; "drop:x" = a cancelled
backlog entry removed without wedging the ring.
"""

import pytest
from factories import make_backend, make_engine

from coopsched.core import Request


def contend(grant_rounds: int, contenders: int, cancel: dict[int, str] | None = None, max_tokens: int = 12,
            priorities: dict | None = None):
    """Speculative requests a, b, c arriving 1 ms apart; acceptance 0 so each round emits one token."""
    backend = make_backend(accept_prob=0.0)
    engine = make_engine(backend, grant_rounds=grant_rounds)
    scheduler = engine.scheduler
    pending = [Request(name, (1, 2, 3), max_tokens, arrival_ms=i * 1.0, **(priorities or {}).get(name, {}))
               for i, name in enumerate("abc"[:contenders])]
    tick = 0
    while pending or scheduler.has_work:
        while pending and pending[0].arrival_ms <= backend.clock.now():
            scheduler.submit(pending.pop(0))
        if cancel and tick in cancel:
            scheduler.cancel(cancel[tick])
        if scheduler.is_idle:
            backend.clock.advance_to(pending[0].arrival_ms)
            continue
        engine.step()
        tick += 1
    assert scheduler.kv.num_in_use == 0 and backend.num_live == 0
    return scheduler


@pytest.mark.parametrize("grant_rounds", [1, 2, 8])
@pytest.mark.parametrize("contenders", [2, 3])
def test_grant_log_pinned(grant_rounds, contenders, golden_logs):
    log = contend(grant_rounds, contenders).obs.grant_log
    assert log == golden_logs[f"G{grant_rounds}-n{contenders}"]


def test_g0_means_no_rotation_and_no_waiters():
    scheduler = contend(0, 3)
    assert scheduler.obs.grant_log == ["a"] and scheduler.obs.waiter_parks == 0


def test_cancelled_waiter_never_wedges_the_ring(golden_logs):
    """Upstream's rule: a cancelled waiter keeps its backlog place until its grant pops it (c, arriving
    meanwhile, finds the backlog full and is served classically); the pop aborts it with an error."""
    scheduler = contend(2, 3, cancel={4: "b"})
    assert scheduler.obs.grant_log == golden_logs["G2-n3-cancel-waiter-b"]
    assert "drop:b" in scheduler.obs.grant_log and "c" not in scheduler.obs.grant_log


def test_a_cancelled_waiter_is_aborted_with_an_error_at_its_grant():
    backend = make_backend(accept_prob=0.0)
    engine = make_engine(backend, grant_rounds=2)
    scheduler = engine.scheduler
    for name in "ab":
        scheduler.submit(Request(name, (1, 2, 3), 12))
    finished = {}
    engine.on_event = lambda e: finished.update({e.seq_id: e}) if e.finish_reason else None
    for tick in range(60):
        if tick == 3:
            scheduler.cancel("b")  # b is a parked waiter
        if not scheduler.has_work:
            break
        engine.step()
    b = finished["b"]
    assert b.finish_reason.value == "error" and b.token_ids == ()
    assert b.outcome.error == "Request cancelled while waiting for the speculative slice slot"
    assert finished["a"].finish_reason.value == "length" and scheduler.kv.num_in_use == 0


def test_cancelled_parked_job_never_wedges_the_ring(golden_logs):
    """Upstream's rule: a cancelled parked job is granted as any other and stops at its round's top."""
    scheduler = contend(2, 3, cancel={9: "a"})
    assert scheduler.obs.grant_log == golden_logs["G2-n3-cancel-parked-a"]
    assert scheduler.obs.grant_log.count("a") == 2 and "drop:a" not in scheduler.obs.grant_log


@pytest.mark.parametrize("mode", ["fused", "cost"])
def test_fused_and_cost_drop_cancelled_entries_at_once(mode):
    backend = make_backend(accept_prob=0.0)
    engine = make_engine(backend, grant_rounds=2, mode=mode)
    scheduler = engine.scheduler
    for name in "ab":
        scheduler.submit(Request(name, (1, 2, 3), 12))
    for _ in range(3):
        engine.step()
    assert "b" in [j.ids[0] for j in scheduler.backlog]
    scheduler.cancel("b")
    engine.step()
    assert "b" not in [j.ids[0] for j in scheduler.backlog] and "drop:b" in scheduler.obs.grant_log


def test_grant_order_most_skipped_overdue_first_and_cancelled_pops_count():
    from coopsched.core import Priority
    from coopsched.core.rotation import Backlog
    from coopsched.core.spec import SpecJob
    jobs = [SpecJob([Request(i, (1,), 4, priority=p)], 4) for i, p in (("n", Priority.NORMAL), ("h", Priority.HIGH))]
    backlog = Backlog(cap=3, skip_cap=2)
    for job, skips in zip(jobs, (2, 3)):
        backlog.park(job)
        job.skips = skips
    assert backlog.grant() is jobs[1] and jobs[0].skips == 3  # upstream's row [(Normal, 2), (High, 3)] -> 1


def test_priority_lane_wins_until_an_entry_is_overdue():
    from coopsched.core import Priority
    from coopsched.core.rotation import Backlog
    from coopsched.core.spec import SpecJob
    low = SpecJob([Request("low", (1,), 4, priority=Priority.LOW)], 4)
    high = SpecJob([Request("high", (1,), 4, priority=Priority.HIGH)], 4)
    backlog = Backlog(cap=2, skip_cap=2)
    backlog.park(low)
    backlog.park(high)
    grants = []
    for _ in range(3):
        winner = backlog.grant()
        grants.append(winner.rows[0].id)
        backlog.park(winner)
    assert grants == ["high", "high", "low"]  # low was skipped twice: overdue, it wins


def test_three_contenders_rotate_when_the_backlog_has_room(golden_logs):
    log = golden_logs["G8-n3"]
    assert [g for g in log if ":" not in g][:3] == ["a", "b", "c"]


@pytest.fixture(scope="module")
def golden_logs(request):
    import json
    import os
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "golden" / "rotation.json"
    cases = {f"G{g}-n{n}": dict(grant_rounds=g, contenders=n) for g in (1, 2, 8) for n in (2, 3)}
    cases["G2-n3-cancel-waiter-b"] = dict(grant_rounds=2, contenders=3, cancel={4: "b"})
    cases["G2-n3-cancel-parked-a"] = dict(grant_rounds=2, contenders=3, cancel={9: "a"})
    if os.environ.get("COOPSCHED_UPDATE_GOLDEN"):
        logs = {name: contend(**kw).obs.grant_log for name, kw in cases.items()}
        path.write_text(json.dumps(logs, indent=1) + "\n")
    return json.loads(path.read_text())
