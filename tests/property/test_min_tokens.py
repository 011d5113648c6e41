"""min_tokens and ignore_eos on the mock: EOS is never sampled as output token i < min_tokens (never at
all with ignore_eos), the target decides per verify position, and speculation changes no token in any
mode, whether or not the drafter knows the rule; a stop string counts only from min_tokens on (vLLM's rule).
Outputs are judged by the one reference oracle (mocks.oracle)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from factories import make_engine
from hypothesis import given
from hypothesis import strategies as st

from coopsched.clock import ManualClock
from coopsched.core import FinishReason, Request, RequestError, SamplingParams
from mocks import ByteTokenizer, CostModel, MockBackend, MockDrafter, MockTarget, oracle

MODES = ["burst", "slice", "fused", "cost"]
PROMPT = (70, 71, 72)
text = ByteTokenizer().decode


def make_backend(*, eos_rate: float = 0.0, accept_prob: float = 0.7, drafter_ignores: bool = False,
                 scripts: dict | None = None) -> MockBackend:
    target = MockTarget(eos_rate=eos_rate, scripts=scripts)
    return MockBackend(ManualClock(), CostModel(), target,
                       MockDrafter(accept_prob, seed=0, ignores_eos_rules=drafter_ignores))


def serve(requests: list[Request], speculative: bool, backend: MockBackend, **config):
    """Fresh copies of `requests` run to completion; {id: (tokens, finish_reason)} and the run."""
    fresh = [Request(r.id, r.prompt_token_ids, r.max_tokens, r.sampling, stop=r.stop,
                     speculative=speculative and r.speculative, arrival_ms=r.arrival_ms) for r in requests]
    result = make_engine(backend, **config).run(fresh)
    assert backend.num_live == 0
    return {r.id: (r.output_token_ids, r.finish_reason) for r in fresh}, result


@st.composite
def requests(draw) -> list[Request]:
    """1-3 speculative candidates with their own EOS rules, and a classic row (fused/cost need one)."""
    out = []
    for i in range(draw(st.integers(1, 3))):
        max_tokens = draw(st.integers(1, 40))
        temperature = draw(st.sampled_from([0.0, 0.0, 0.8]))
        sampling = SamplingParams(temperature, seed=i if temperature else None,
                                  min_tokens=draw(st.integers(0, max_tokens)),
                                  ignore_eos=draw(st.sampled_from([False, False, True])))
        prompt = tuple(draw(st.lists(st.integers(32, 126), min_size=1, max_size=12)))
        out.append(Request(f"s{i}", prompt, max_tokens, sampling,
                           stop=draw(st.sampled_from([(), (), ("a",), ("xy", "Q")])), arrival_ms=i * 3.0))
    out.append(Request("c", (65, 66), 30, SamplingParams(min_tokens=draw(st.integers(0, 30))),
                       speculative=False))
    return out


@given(reqs=requests(), mode=st.sampled_from(MODES), block_size=st.integers(2, 6),
       eos_rate=st.sampled_from([0.05, 0.2, 0.5]), accept_prob=st.sampled_from([0.3, 0.9, 1.0]),
       drafter_ignores=st.booleans(), batch=st.booleans())
def test_min_tokens_parity_and_lengths(reqs, mode, block_size, eos_rate, accept_prob, drafter_ignores, batch):
    config = dict(mode=mode, block_size=block_size, enable_batch=batch)
    knobs = dict(eos_rate=eos_rate, accept_prob=accept_prob, drafter_ignores=drafter_ignores)
    spec, _ = serve(reqs, True, make_backend(**knobs), **config)
    classic, _ = serve(reqs, False, make_backend(**knobs), **config)
    assert spec == classic
    target = MockTarget(eos_rate=eos_rate)
    for r in reqs:
        tokens, reason = spec[r.id]
        assert (tokens, reason) == oracle.expected(target, r), r.id
        stopped_by_string = reason is FinishReason.STOP and any(s in text(tokens) for s in r.stop)
        if r.sampling.ignore_eos and not stopped_by_string:
            assert len(tokens) == r.max_tokens and reason is FinishReason.LENGTH
        assert len(tokens) >= r.sampling.min_tokens  # neither EOS nor a stop string ends it sooner


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("drafter_ignores", [False, True], ids=["drafter-knows", "drafter-ignores"])
@pytest.mark.parametrize("min_tokens, ignore_eos, want", [
    pytest.param(0, False, 4, id="eos-at-4-ends-it"),
    pytest.param(4, False, 4, id="min-4-eos-at-4-allowed"),
    pytest.param(5, False, 7, id="min-5-skips-eos-at-4-stops-at-7"),
    pytest.param(8, False, 9, id="min-8-skips-4-and-7-stops-at-9"),
    pytest.param(1, True, 20, id="ignore-eos-runs-to-max"),
])
def test_scripted_eos_positions(mode, drafter_ignores, min_tokens, ignore_eos, want):
    """The target's script puts EOS at output indices 4, 7 and 9: min_tokens moves the end exactly."""
    script = [80, 81, 82, 83, 256, 84, 85, 256, 86, 256]
    backend = make_backend(accept_prob=1.0, drafter_ignores=drafter_ignores, scripts={PROMPT: script})
    request = Request("s", PROMPT, 20, SamplingParams(min_tokens=min_tokens, ignore_eos=ignore_eos))
    classic = Request("c", (65, 66), 24, speculative=False)
    outputs, _ = serve([request, classic], True, backend, mode=mode, block_size=4)
    tokens, reason = outputs["s"]
    assert len(tokens) == want
    assert reason is (FinishReason.LENGTH if ignore_eos else FinishReason.STOP)
    assert tokens[:4] == script[:4] and 256 not in tokens
    assert outputs == serve([request, classic], False, make_backend(scripts={PROMPT: script}), mode=mode)[0]


def test_a_drafter_that_ignores_the_rule_costs_rounds_not_tokens():
    """Its EOS proposals at suppressed positions are rejected by the verify: more rounds, same tokens."""
    script = [80, 256, 81, 256, 82, 256, 83, 256]
    request = Request("s", PROMPT, 16, SamplingParams(min_tokens=12))
    runs = {}
    for ignores in (False, True):
        backend = make_backend(accept_prob=1.0, drafter_ignores=ignores, scripts={PROMPT: script})
        outputs, result = serve([request], True, backend, mode="slice", block_size=4)
        runs[ignores] = outputs["s"], sum(t.action == "spec_round" for t in result.ticks)
    assert runs[True][0] == runs[False][0]
    assert runs[True][1] > runs[False][1]


def test_eos_suppression_keeps_the_prefix():
    """Before the first EOS nothing changes: a min_tokens output starts with the min_tokens=0 output."""
    for seed in range(30):
        prompt = tuple(32 + (seed * 7 + j) % 90 for j in range(6))
        plain, _ = serve([Request("s", prompt, 40)], True, make_backend(eos_rate=0.2), block_size=3)
        longer, _ = serve([Request("s", prompt, 40, SamplingParams(min_tokens=30))], True,
                          make_backend(eos_rate=0.2), block_size=3)
        assert longer["s"][0][:len(plain["s"][0])] == plain["s"][0]
        assert len(longer["s"][0]) >= 30


def test_parity_catches_a_rule_decided_once_per_row(monkeypatch):
    """Planted bug: the verify applies the rule of a row's first position to all K of its positions."""
    real_verify = MockBackend.verify

    def row_level(self, rows):
        saved = {seq_id: self._seqs[seq_id].params for seq_id, _, _ in rows}
        for seq_id, params in saved.items():
            first = len(self._seqs[seq_id].tokens) + 1 - self._seqs[seq_id].prompt_len
            self._seqs[seq_id].params = replace(params, min_tokens=0, ignore_eos=params.suppresses_eos(first))
        try:
            return real_verify(self, rows)
        finally:
            for seq_id, params in saved.items():
                self._seqs[seq_id].params = params

    monkeypatch.setattr(MockBackend, "verify", row_level)
    script = [80, 81, 82, 83, 256, 84, 85, 86]
    request = Request("s", PROMPT, 8, SamplingParams(min_tokens=3))
    spec, _ = serve([request], True, make_backend(accept_prob=1.0, scripts={PROMPT: script}), block_size=4)
    classic, _ = serve([request], False, make_backend(scripts={PROMPT: script}), block_size=4)
    assert classic["s"] == (script[:4], FinishReason.STOP)
    assert spec != classic  # round 1 verifies indices 1-4 and suppressed the EOS at 4 too


@pytest.mark.parametrize("kwargs, message", [
    pytest.param(dict(max_tokens=4, sampling=SamplingParams(min_tokens=5)),
                 "min_tokens=5 is more than max_tokens=4", id="min-over-max"),
    pytest.param(dict(max_tokens=4, sampling=SamplingParams(min_tokens=-1)),
                 "min_tokens=-1 must be >= 0", id="negative"),
])
def test_invalid_min_tokens(kwargs, message):
    with pytest.raises(RequestError, match=message):
        Request("r", (1, 2), **kwargs)
