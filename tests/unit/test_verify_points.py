"""Which of a twin sweep's points `--verify-points` runs live: loads evenly spread (the highest always
in), in the server's mode, or the default mode's when the server reports none."""

from types import SimpleNamespace

import pytest

from harness.sweep.points import SweepError
from harness.sweep.verify import Verifier, spread_loads


@pytest.mark.parametrize("loads, count, picked", [
    pytest.param((1, 2, 4, 8), 2, [1, 8], id="two-ends"),
    pytest.param((1, 2, 4, 8, 16), 3, [1, 4, 16], id="three-spread"),
    pytest.param((1, 2, 4), 1, [4], id="one-the-highest"),
    pytest.param((1, 2), 5, [1, 2], id="more-than-swept-all"),
])
def test_spread_loads(loads, count, picked):
    assert spread_loads(loads, count) == picked


def verifier(mode: str | None) -> Verifier:
    v = Verifier.__new__(Verifier)  # no server to ask: its /health answer is given
    v.server, v.count = SimpleNamespace(url="http://x", reports_mode=mode is not None, mode=mode or "external"), 2
    return v


@pytest.mark.parametrize("mode, modes, default, chosen", [
    pytest.param("fused", ("burst", "slice", "fused", "cost"), "slice", "fused", id="the-servers-mode"),
    pytest.param(None, ("burst", "slice", "fused", "cost"), "slice", "slice", id="no-mode-the-default"),
    pytest.param(None, ("burst", "cost"), "slice", "burst", id="no-mode-default-not-swept-the-first"),
])
def test_the_verified_mode(mode, modes, default, chosen):
    v = verifier(mode)
    v.check_modes(modes, default)
    assert v.mode == chosen


def test_a_sweep_without_the_servers_mode_is_refused():
    with pytest.raises(SweepError, match=r"runs fused .* add it or leave --mode out"):
        verifier("fused").check_modes(("slice",), "slice")
