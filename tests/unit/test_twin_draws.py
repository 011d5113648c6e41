"""A twin's draws: `runner.execute(draw=d)` keeps the scenario's requests and draws the backend's costs
and acceptance (and vLLM's proposals) anew; the held-out prediction is the mean of TWIN_DRAWS runs,
one per draw, with their spread beside each row. Each rule has a planted regression."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from plants import caught

from coopsched.core import SchedulerConfig
from coopsched.twins import make_scheduler
from coopsched.twins.vllm import draft_length, proposes
from harness.calibrate import heldout
from harness.run import runner
from harness.sweep.points import Timed
from mocks import CostModel

COST = CostModel(prefill_fixed_ms=2.0, prefill_per_token_ms=0.2, decode_ms=[[1, 5.0], [8, 9.0]],
                 round_ms=[[4, 30.0]], accept_prob=0.6, jitter=0.2)
CONFIG = SchedulerConfig(mode="slice", block_size=4)
SCEN = heldout.workload(20.0, 12)


def execute(draw: int, kind: str = "coopsched", **params) -> runner.Run:
    profile = runner.Profile(COST, kind, params)
    return runner.execute(runner.priced(SCEN, profile), CONFIG, heldout.SEED, draw=draw)


def test_a_draw_keeps_the_requests_and_draws_the_rest():
    base, again, other = execute(0), execute(0), execute(3)
    assert again.token_times == base.token_times  # a draw is a seed: the same draw, the same run
    shape = lambda run: [(r.id, r.arrival_ms, r.prompt_token_ids, r.max_tokens, r.speculative) for r in run.requests]
    assert shape(other) == shape(base)
    assert other.token_times != base.token_times


def test_vllms_proposals_move_with_the_draw():
    """A row's drafts at each of its first 40 steps: draw 0 keys them by the request alone (the keys
    the differential test shares with vLLM's own scheduler), another draw anew."""
    model = make_scheduler("vllm", SchedulerConfig(has_drafter=True, block_size=5),
                           {"num_speculative_tokens": 4, "propose_share": 0.4, "draft_tokens": 3.3})

    def drafts(draw: int) -> list[int]:
        model.draw = draw
        return [model._drafts(SimpleNamespace(id="r7", output_token_ids=[0] * n)) for n in range(40)]

    assert drafts(0) == [draft_length("r7", n, 3.3) if proposes("r7", n, 0.4) else 0 for n in range(40)]
    assert drafts(5) != drafts(0)


def test_the_prediction_is_the_mean_of_the_draws():
    """A twin whose draw d serves every request 10 x (d + 1) ms after its send: the prediction's TTFT
    p50 is the draws' mean, 45 ms, and its spread (80 - 10) / 45."""
    seen: list[int] = []

    def served(scen, draw: int) -> list[Timed]:
        ttft = 10.0 * (draw + 1)
        return [Timed(s.id, s.arrival_ms, [s.arrival_ms + ttft, s.arrival_ms + ttft + 1], s.speculative)
                for s in scen.specs(heldout.SEED)]

    def predict(scen, draw: int) -> list[Timed]:
        seen.append(draw)
        return served(scen, draw)

    live = lambda scen, run, _give_up=None: served(scen, 3)
    report = heldout.check(live, predict, 50.0, num_requests=8, runs=1, capacity_rungs=0)
    light = report["workloads"]["light"]["rows"]["ttft_p50_ms"]
    assert light["predicted"] == pytest.approx(45.0) and light["measured"] == pytest.approx(40.0)
    assert light["twin_spread"] == pytest.approx(70.0 / 45.0, abs=1e-4)
    assert set(range(heldout.TWIN_DRAWS)) <= set(seen)


# -- planted regressions: the rule removed, the tests above must fail -----------------------------------
def _one_seed(mp):  # every draw prices and accepts with the seed's own draws
    mp.setattr(runner, "DRAW_STRIDE", 0)


def _vllm_keys_ignore_the_draw(mp):
    from coopsched.twins import vllm

    mp.setattr(vllm.VllmModel, "draw", property(lambda self: 0, lambda self, value: None))  # every draw keys as 0


def _first_draw_only(mp):  # the prediction is one run, as before the draws
    mp.setattr(heldout, "TWIN_DRAWS", 1)


PLANTS = {
    "one-seed": (_one_seed, test_a_draw_keeps_the_requests_and_draws_the_rest),
    "vllm-keys-ignore-the-draw": (_vllm_keys_ignore_the_draw, test_vllms_proposals_move_with_the_draw),
    "first-draw-only": (_first_draw_only, test_the_prediction_is_the_mean_of_the_draws),
}


test_planted_regression_is_caught = caught(PLANTS)
