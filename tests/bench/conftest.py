"""Bench fixtures: a scheduler with B classic rows on a zero-cost mock, and the scenario x mode grid."""

from __future__ import annotations

import pytest

from coopsched.clock import ManualClock
from coopsched.core import Request, Scheduler, SchedulerConfig
from coopsched.engine import Engine
from mocks import CostModel, MockBackend

# every charge is free (decode and verify at 0 ms): a tick costs only the scheduler's own CPU
ZERO_COST = CostModel(prefill_fixed_ms=0, prefill_per_token_ms=0, draft_prefill_per_token_ms=0,
                      decode_ms=[[1, 0]], draft_per_token_ms=0, verify_ms=[[1, 0]])
EFFECTIVELY_ENDLESS = 10**9


def make_engine(num_rows: int, prompt_len: int = 8) -> Engine:
    """An engine whose decode batch holds `num_rows` classic rows that never finish."""
    config = SchedulerConfig(max_batch_size=num_rows, num_kv_slots=num_rows,
                             slot_tokens=EFFECTIVELY_ENDLESS + prompt_len)
    clock = ManualClock()
    engine = Engine(Scheduler(config), MockBackend(clock, ZERO_COST), clock)
    for i in range(num_rows):
        engine.scheduler.submit(Request(id=f"r{i}", prompt_token_ids=tuple(range(1, prompt_len + 1)),
                                        max_tokens=EFFECTIVELY_ENDLESS, speculative=False))
    while len(engine.scheduler.running) < num_rows:  # admit every row (one prefill tick each)
        engine.step()
    return engine


@pytest.fixture
def engine_with_rows():
    return make_engine
