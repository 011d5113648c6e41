"""The reference oracle's rules on a scripted target: where EOS, stop strings, min_tokens,
ignore_eos and max_tokens end a request, worked out by hand from the script."""

from __future__ import annotations

import pytest

from coopsched.core import FinishReason, Request, SamplingParams
from mocks import MockTarget, oracle
from mocks.model import context_hash

EOS = 256
PROMPT = (70, 71, 72)
SCRIPT = [80, 81, 82, 83, EOS, 84, 85, EOS, 86, 87]  # "PQRS", EOS, "TU", EOS, "VW"
STOP, LENGTH = FinishReason.STOP, FinishReason.LENGTH


def expect(max_tokens: int = 10, min_tokens: int = 0, ignore_eos: bool = False, stop=()) -> oracle.Expected:
    request = Request("r", PROMPT, max_tokens, SamplingParams(min_tokens=min_tokens, ignore_eos=ignore_eos),
                      stop=stop)
    return oracle.expected(MockTarget(scripts={PROMPT: SCRIPT}), request)


@pytest.mark.parametrize("kwargs, text, reason", [
    pytest.param({}, "PQRS", STOP, id="eos-ends-it-and-is-not-output"),
    pytest.param(dict(max_tokens=3), "PQR", LENGTH, id="max-tokens-before-the-eos"),
    pytest.param(dict(max_tokens=4), "PQRS", LENGTH, id="eos-past-the-budget-is-never-sampled"),
    pytest.param(dict(min_tokens=4), "PQRS", STOP, id="eos-at-min-tokens-is-allowed"),
    pytest.param(dict(min_tokens=5, stop=("U",)), "PQRS?TU", STOP, id="masked-eos-then-stop-string"),
    pytest.param(dict(stop=("R",)), "PQR", STOP, id="stop-string-kept-in-the-output"),
    pytest.param(dict(stop=("QR",)), "PQR", STOP, id="multi-token-stop-string"),
    pytest.param(dict(stop=("R",), min_tokens=3), "PQR", STOP, id="stop-string-at-min-tokens-counts"),
    pytest.param(dict(stop=("QR",), min_tokens=3), "PQR", STOP, id="stop-string-ending-at-min-tokens-counts"),
    pytest.param(dict(stop=("Q",), min_tokens=3), "PQRS", STOP, id="stop-string-before-min-tokens-never-counts"),
    pytest.param(dict(stop=("S",), max_tokens=4), "PQRS", STOP, id="stop-string-on-the-last-token-beats-length"),
    pytest.param(dict(ignore_eos=True, stop=("W",)), "PQRS?TU?VW", STOP, id="ignore-eos-then-stop-string"),
])
def test_the_rules(kwargs, text, reason):
    got = expect(**kwargs)
    assert "".join("?" if i in (4, 7) else chr(t) for i, t in enumerate(got.token_ids)) == text
    assert got.finish_reason is reason
    assert EOS not in got.token_ids


def test_a_masked_eos_becomes_the_targets_runner_up():
    """With EOS masked the target picks the printable token of the same context (what masking EOS's logit
    gives), and the script resumes after it."""
    target = MockTarget(scripts={PROMPT: SCRIPT})
    got = expect(ignore_eos=True)
    assert got.token_ids[:4] == SCRIPT[:4] and got.token_ids[5:7] == SCRIPT[5:7]
    context = list(PROMPT) + SCRIPT[:4]
    assert got.token_ids[4] == target.next_token(context, context_hash(context), len(PROMPT), suppress_eos=True)
    assert got.finish_reason is LENGTH and len(got.token_ids) == 10
