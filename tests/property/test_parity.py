"""Greedy parity, generated: a speculative stream equals the same request decoded classically,
whatever the drafter proposes, at B = 1 and in batched windows, in burst and slice mode; and
chunked or batched prefill changes no token, in any mode."""

from factories import make_backend, make_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from coopsched.core import MODES, Request
from mocks import MockTarget, oracle

prompts = st.lists(st.integers(32, 126), min_size=1, max_size=20).map(tuple)
scripts = st.lists(st.integers(0, 7), max_size=12)


def serve(requests, speculative: bool, *, block_size, scripts_by_id, eos_rate, mode, batch):
    backend = make_backend(target=MockTarget(eos_rate=eos_rate), scripts=scripts_by_id, accept_prob=0.5)
    scheduler = make_engine(backend, mode=mode, block_size=block_size, enable_batch=batch)
    fresh = [Request(r.id, r.prompt_token_ids, r.max_tokens, speculative=speculative, stop=r.stop,
                     arrival_ms=r.arrival_ms) for r in requests]
    scheduler.run(fresh)
    assert scheduler.scheduler.kv.num_in_use == 0 and backend.num_live == 0
    return {r.id: (r.output_token_ids, r.finish_reason, r.served_speculatively) for r in fresh}, scheduler


@settings(deadline=None)
@given(prompt=prompts, max_tokens=st.integers(1, 60), block_size=st.integers(2, 6), script=scripts,
       eos_rate=st.sampled_from([0.0, 0.02, 0.2]), mode=st.sampled_from(["slice", "burst"]),
       stop=st.sampled_from([(), ("a",), ("xy", "Q")]))
def test_b1_parity(prompt, max_tokens, block_size, script, eos_rate, mode, stop):
    requests = [Request("s", prompt, max_tokens, stop=stop)]
    kwargs = dict(block_size=block_size, scripts_by_id={"s": script}, eos_rate=eos_rate, mode=mode, batch=False)
    spec, scheduler = serve(requests, True, **kwargs)
    classic, _ = serve(requests, False, **kwargs)
    assert spec["s"][:2] == classic["s"][:2] == oracle.expected(MockTarget(eos_rate=eos_rate), requests[0])
    assert spec["s"][2] is True and classic["s"][2] is False
    (record,) = scheduler.scheduler.obs.bursts
    assert record.accepted_draft_tokens <= record.drafted_tokens == record.rounds * (block_size - 1)


@settings(deadline=None)
@given(prompt_len=st.integers(1, 12), max_tokens=st.integers(1, 40), block_size=st.integers(2, 5),
       rows=st.integers(2, 4), row_scripts=st.lists(scripts, min_size=4, max_size=4),
       eos_rate=st.sampled_from([0.0, 0.05]), mode=st.sampled_from(["slice", "burst"]),
       data=st.data())
def test_batched_window_parity(prompt_len, max_tokens, block_size, rows, row_scripts, eos_rate, mode, data):
    requests = [Request(f"w{i}", data.draw(st.lists(st.integers(32, 126), min_size=prompt_len,
                                                     max_size=prompt_len).map(tuple)), max_tokens)
                for i in range(rows)]
    kwargs = dict(block_size=block_size, scripts_by_id={f"w{i}": row_scripts[i] for i in range(rows)},
                  eos_rate=eos_rate, mode=mode, batch=True)
    spec, scheduler = serve(requests, True, **kwargs)
    classic, _ = serve(requests, False, **kwargs)
    assert {k: v[:2] for k, v in spec.items()} == {k: v[:2] for k, v in classic.items()}
    assert {r.id: oracle.expected(MockTarget(eos_rate=eos_rate), r) for r in requests} == {
        k: v[:2] for k, v in spec.items()}
    assert len(scheduler.scheduler.obs.grant_log[0].split(",")) == rows  # one window held every row


def test_parity_check_catches_a_missing_rollback(monkeypatch):
    from harness.run import runner, scenario
    from mocks import MockBackend
    monkeypatch.setattr(MockBackend, "rewind", lambda self, seq_id, n: None)
    checks = {c["name"]: c for c in runner.run_scenario(scenario.load("concurrency2"), "slice")["checks"]}
    assert not checks["parity"]["ok"] and checks["parity"]["value"] == 1


@settings(deadline=None)
@given(prompt_lens=st.lists(st.integers(1, 160), min_size=1, max_size=5), chunk=st.integers(0, 48),
       max_batch_prefill=st.integers(1, 4), mode=st.sampled_from(MODES), block_size=st.integers(2, 5),
       max_tokens=st.integers(1, 24), eos_rate=st.sampled_from([0.0, 0.05]), batch=st.booleans(), data=st.data())
def test_chunked_and_batched_prefill_keep_parity(prompt_lens, chunk, max_batch_prefill, mode, block_size,
                                                 max_tokens, eos_rate, batch, data):
    """Every request's tokens equal speculation-off decode with whole, one-at-a-time prefill,
    whatever the chunk size, the batch of admissions, the mode and the mix of requests."""
    speculative = data.draw(st.lists(st.booleans(), min_size=len(prompt_lens), max_size=len(prompt_lens)))
    arrivals = data.draw(st.lists(st.sampled_from([0.0, 3.0, 40.0]), min_size=len(prompt_lens),
                                  max_size=len(prompt_lens)))
    requests = [Request(f"r{i}", tuple(32 + (i * 31 + j * 7) % 95 for j in range(n)), max_tokens,
                        speculative=s, arrival_ms=t)
                for i, (n, s, t) in enumerate(zip(prompt_lens, speculative, arrivals))]

    def serve_with(spec: bool, **config):
        backend = make_backend(target=MockTarget(eos_rate=eos_rate), accept_prob=0.5)
        engine = make_engine(backend, mode=mode, block_size=block_size, enable_batch=batch, **config)
        fresh = [Request(r.id, r.prompt_token_ids, r.max_tokens, speculative=spec and r.speculative,
                         arrival_ms=r.arrival_ms) for r in requests]
        engine.run(fresh)
        assert engine.scheduler.kv.num_in_use == 0 and backend.num_live == 0
        return {r.id: (r.output_token_ids, r.finish_reason) for r in fresh}

    chunked = serve_with(True, prefill_chunk_tokens=chunk, max_batch_prefill=max_batch_prefill)
    assert chunked == serve_with(False)
