"""Upstream's speculative counts from a request's BurstFinalized record, against rounds counted one
by one: K draft tokens per round, and the tokens each round emitted minus one."""

import pytest
from factories import make_backend, make_engine, make_requests

from coopsched.core import TickKind
from coopsched.server.protocol import spec_counts, timings

ROUNDS = (TickKind.ROUND, TickKind.GRANT)


@pytest.mark.parametrize("mode, accept_prob", [("slice", 0.7), ("slice", 0.0), ("slice", 1.0), ("burst", 0.7),
                                               ("fused", 0.7), ("cost", 0.7)])
def test_per_request_counts_equal_the_rounds_counted_one_by_one(mode, accept_prob):
    per_round: dict[str, list[int]] = {}

    def on_tick(committed):
        if committed.record.kind in ROUNDS or committed.record.action.value == "fused":
            for event in committed.events:
                if event.token_ids and event.seq_id in spec_ids:
                    per_round.setdefault(event.seq_id, []).append(len(event.token_ids) - 1)

    engine = make_engine(make_backend(accept_prob=accept_prob), mode=mode)
    engine.on_tick = on_tick
    requests = make_requests(3, max_tokens=23, prefix="s") + make_requests(2, speculative=False, prefix="c")
    spec_ids = {r.id for r in requests if r.speculative}
    engine.run(requests)
    bursts = {b.seq_id: b.to_json() for b in engine.scheduler.obs.bursts}
    assert set(bursts) == spec_ids
    for seq_id, burst in bursts.items():
        rounds, draft_n, accepted = spec_counts(burst)
        assert rounds == burst["rounds"] > 0 and draft_n == burst["drafted_tokens"] + rounds
        assert draft_n == 4 * rounds or mode == "cost"  # the cost arbiter picks K per round
        if mode != "burst":  # a burst's rounds share one tick: only its record says how many ran
            assert (len(per_round[seq_id]), sum(per_round[seq_id])) == (rounds, accepted)
        assert 0 <= accepted <= draft_n


def test_a_classic_request_drafts_nothing():
    assert spec_counts(None) == (0, 0, 0)
    t = timings(5, 12.5, 7, 30.0, None, "mtp")
    assert (t["draft_n"], t["draft_n_accepted"], t["draft_rounds"], t["draft_kind"]) == (0, 0, 0, "none")
    assert (t["prompt_n"], t["predicted_n"], t["predicted_per_second"]) == (5, 7, round(7e3 / 30, 3))


@pytest.mark.parametrize("samples, expected", [
    pytest.param({"llamacpp:spec_decode_num_drafts_total": 5, "llamacpp:spec_decode_num_draft_tokens_total": 20,
                  "llamacpp:spec_decode_num_accepted_tokens_total": 9, "coopsched_spec_rounds_total": 5},
                 {"drafts": 5, "draft_tokens": 20, "accepted": 9}, id="llama-names-first"),
    pytest.param({'llamacpp:spec_decode_num_drafts_total{slot="0"}': 2,
                  'llamacpp:spec_decode_num_drafts_total{slot="1"}': 3},
                 {"drafts": 5, "draft_tokens": None, "accepted": None}, id="label-sets-summed"),
    pytest.param({"coopsched_spec_rounds_total": 4, "coopsched_spec_draft_tokens_total": 12},
                 {"drafts": 4, "draft_tokens": 16, "accepted": None}, id="coopsched-names-only"),
    pytest.param({"vllm:num_requests_running": 1}, None, id="no-speculative-counters"),
    pytest.param(None, None, id="no-metrics"),
])
def test_spec_counters_of_any_server(samples, expected):
    from harness.live.client import spec_counters
    assert spec_counters(samples) == expected


def test_a_finished_request_finds_its_tick_already_counted():
    """A client that reads /metrics as soon as its response ends must see its own rounds: the engine
    books a tick's counters before it tells any request that it finished."""
    from coopsched.server.metrics import Metrics

    metrics = Metrics()
    engine = make_engine(make_backend(accept_prob=0.7), mode="slice")
    seen_at_finish: dict[str, float] = {}
    counted = "llamacpp:spec_decode_num_accepted_tokens_total"

    def on_event(event):
        if event.finish_reason is not None and event.outcome is not None and event.outcome.burst is not None:
            seen_at_finish[event.seq_id] = metrics.registry.get_sample_value(counted)

    engine.on_tick, engine.on_event = metrics.record_tick, on_event
    engine.run(make_requests(3, max_tokens=23, prefix="s"))
    accepted = {b.seq_id: spec_counts(b.to_json())[2] for b in engine.scheduler.obs.bursts}
    finish_order = sorted(seen_at_finish, key=seen_at_finish.get)
    running = 0
    for seq_id in finish_order:  # each finish sees every accepted token of itself and all before it
        running += accepted[seq_id]
        assert seen_at_finish[seq_id] >= running
    assert max(seen_at_finish.values()) == sum(accepted.values()) > 0
