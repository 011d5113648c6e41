"""Calibrate an in-process backend from its engine's own ticks (the MLX backend in real time, or any
backend): what the mock must charge is what a tick costs, executor and commit included.

A pass runs small workloads through the engine: classic batches of B = 1, 2, 4, 8 (decode steps and
prefills at several prompt lengths), lone speculative requests (slice 0 and rounds; the drafter's
acceptance), a classic and a speculative request alternating (the switch between the two paths),
and a fused run. Passes are meant to be interleaved with whatever is checked against the profile,
so both see the same machine. The round is one term (`round_ms`): the draft is inside it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from coopsched.clock import RealClock
from coopsched.core import Request, Scheduler, SchedulerConfig
from coopsched.core.types import ActionKind, TickKind
from coopsched.engine import Engine
from harness.calibrate import fit

PREFILL_LENGTHS = (8, 32, 128)
DECODE_BATCHES = (1, 2, 4, 8)
DECODE_TOKENS = 24
SPEC_TOKENS = 48
MIN_SWITCH_SE = 2.0  # a switch overhead is kept only when it stands this many standard errors above 0
ROUNDS = (TickKind.ROUND, TickKind.GRANT)


def _prompt(n: int, offset: int) -> tuple[int, ...]:
    """Seeded printable bytes, as scenario prompts are: the drafter's acceptance depends on the text
    (an arithmetic pattern read 0.75 where the twin workload's prompts read 0.69)."""
    rng = random.Random(f"calibrate:{offset}:{n}")
    return tuple(rng.randrange(32, 127) for _ in range(n))


def _round_walls(ticks) -> list[float]:
    return [t.wall_ms for t in ticks if t.kind in ROUNDS]


@dataclass
class TickSamples:
    """Tick walls (ms) by what the tick did, pooled over passes."""
    decode: dict[int, list[float]] = field(default_factory=dict)        # rows -> walls
    admit: list[tuple[int, float]] = field(default_factory=list)        # (prompt tokens, wall)
    slice0: list[tuple[int, float]] = field(default_factory=list)
    round: dict[int, list[float]] = field(default_factory=dict)        # K -> lone B = 1 rounds
    after: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (tick, tick before) -> B = 1 walls
    fused: dict[int, list[float]] = field(default_factory=dict)         # classic rows -> walls
    drafted: int = 0
    accepted: int = 0


class TickCalibration:
    """Passes over a backend: `make_backend(clock)` gives a fresh backend on a `clock_factory()` clock."""

    def __init__(self, make_backend: Callable[[object], object], block_size: int = 4,
                 clock_factory: Callable[[], object] = RealClock) -> None:
        self.make_backend, self.block_size, self.clock_factory = make_backend, block_size, clock_factory
        self.samples = TickSamples()
        self._passes = 0

    def _run(self, requests: list[Request], mode: str, block_size: int | None = None):
        clock = self.clock_factory()
        scheduler = Scheduler(SchedulerConfig(mode=mode, block_size=block_size or self.block_size,
                                              max_batch_size=16, num_kv_slots=32))
        result = Engine(scheduler, self.make_backend(clock), clock).run(requests, keep_events=False)
        return scheduler, [t for t in result.ticks if t.action is not ActionKind.IDLE]

    def run_pass(self) -> None:
        n, s = self._passes, self.samples
        self._passes += 1
        for b in DECODE_BATCHES:
            requests = [Request(f"c{i}", _prompt(PREFILL_LENGTHS[(n + i) % 3], 50 * i + n), DECODE_TOKENS,
                                speculative=False) for i in range(b)]
            lengths = {r.id: len(r.prompt_token_ids) for r in requests}
            _, ticks = self._run(requests, "slice")
            for t in ticks:
                if t.kind is TickKind.DECODE and len(t.request_ids) == b:
                    s.decode.setdefault(b, []).append(t.wall_ms)
                elif t.kind is TickKind.ADMIT:
                    s.admit.append((lengths[t.request_ids[0]], t.wall_ms))
        for i, length in enumerate(PREFILL_LENGTHS):  # slice 0 at each length, rounds of K
            scheduler, ticks = self._run([Request("s", _prompt(length, 7 * i + n), SPEC_TOKENS)], "slice")
            s.slice0 += [(length, t.wall_ms) for t in ticks if t.kind is TickKind.SLICE0]
            s.round.setdefault(self.block_size, []).extend(_round_walls(ticks))
            s.drafted += scheduler.obs.drafted_tokens
            s.accepted += scheduler.obs.accepted_tokens
        for k in range(2, self.block_size):  # narrower rounds, which cost mode picks
            _, ticks = self._run([Request("s", _prompt(32, 13 * k + n), SPEC_TOKENS)], "slice", block_size=k)
            s.round.setdefault(k, []).extend(_round_walls(ticks))
        self._alternating(n)
        self._fused(n)

    def _alternating(self, n: int) -> None:
        """A classic and a speculative request in slice mode, one outliving the other, so each path
        runs both right after the other path and right after itself, on the same request."""
        for classic_tokens, spec_tokens in ((SPEC_TOKENS + 32, 24), (12, SPEC_TOKENS + 32)):
            classic = Request("c", _prompt(16, 17 * classic_tokens + n), classic_tokens, speculative=False)
            spec = Request("s", _prompt(32, 19 * spec_tokens + n), spec_tokens)
            _, ticks = self._run([classic, spec], "slice")
            for before, t in itertools.pairwise(ticks):
                kinds = tuple("decode" if x.kind is TickKind.DECODE else "round" if x.kind in ROUNDS else None
                              for x in (t, before))
                if None not in kinds:
                    self.samples.after.setdefault(kinds, []).append(t.wall_ms)

    def _fused(self, n: int) -> None:
        requests = [Request(f"c{i}", _prompt(16, 11 * i + n), SPEC_TOKENS + 16, speculative=False) for i in range(2)]
        requests.append(Request("s", _prompt(32, 5 + n), SPEC_TOKENS))
        _, ticks = self._run(requests, "fused")
        for t in ticks:
            if t.kind is TickKind.FUSED:
                self.samples.fused.setdefault(len(t.request_ids) - 1, []).append(t.wall_ms)

    # -- the profile -----------------------------------------------------------------------
    def profile(self, fused_padding: str = "split", draft_per_token_ms: float = 0.0) -> dict:
        """CostModel fields (and `fit`: the fits with their residuals) from the samples so far.
        The draft inside a round is `draft_per_token_ms`, or what fused steps leave of it
        beside their forward (`draft_from_fused`) when the forward is not split.

        Each term is its mean (estimated robustly: `fit.levels`) and draws its spread from the
        fitted quantiles, so throughput (means) and percentiles both carry over."""
        s, k = self.samples, self.block_size
        batches = sorted(s.decode)
        decode_at, decode_ratios = fit.levels(s.decode)
        decode = fit.monotone([decode_at[b] for b in batches], [len(s.decode[b]) for b in batches])
        decode_at = dict(zip(batches, decode))
        prefill = fit.LinearFit.of([x for x, _ in s.admit], [y for _, y in s.admit])
        extra = [(x, y - prefill(x)) for x, y in s.slice0]
        draft_prefill = sum(x * d for x, d in extra) / sum(x * x for x, _ in extra) if extra else 0.0
        round_at, round_ratios = fit.levels(s.round)
        widths = sorted(round_at)
        rounds = fit.monotone([round_at[w] for w in widths], [len(s.round[w]) for w in widths])
        round_ms = rounds[-1]
        switch, switch_raw, switch_se = self._switch()
        share = s.accepted / s.drafted if s.drafted else 0.0
        accept = fit.acceptance_from_tokens(1 + share * (k - 1), k)
        fused_at, fused_ratios = fit.levels(s.fused)
        quantiles = {
            "prefill": fit.jitter_quantiles([y / prefill(x) for x, y in s.admit if prefill(x) > 0]),
            "decode": fit.jitter_quantiles(decode_ratios),
            "verify": fit.jitter_quantiles(round_ratios),
            "fused": fit.jitter_quantiles(fused_ratios),
        }
        decode_points = [[b, round(v, 4)] for b, v in zip(batches, decode)]
        fused_steps = {c: float(v) for c, v in fused_at.items()}
        if fused_padding != "split" and fused_steps:  # a split step is decode + round whatever the draft
            draft_per_token_ms = draft_from_fused(fused_steps, decode_points, k, fused_padding)
        return {
            **fit.profile_terms(prefill, draft_prefill, decode_points, draft_per_token_ms, k, round_ms,
                                [[w, round(v, 4)] for w, v in zip(widths, rounds)], fused_padding, switch,
                                quantiles, accept),
            "fit": {"passes": self._passes, "prefill_residuals_ms": [round(r, 3) for r in prefill.residuals],
                    "switch_ms_measured": round(switch_raw, 4), "switch_ms_se": round(switch_se, 4),
                    "acceptance_share": round(share, 4),
                    "fused_step_ms": {c: round(v, 4) for c, v in sorted(fused_steps.items())},
                    "samples": {"decode": {b: len(s.decode[b]) for b in batches},
                                "round": {w: len(s.round[w]) for w in widths},
                                "admit": len(s.admit), "slice0": len(s.slice0)}},
        }

    def _switch(self) -> tuple[float, float, float]:
        """Half what a decode after a round and a round after a decode cost over a decode after a
        decode and a round after a round, on the same requests (kept, measured, standard error):
        kept only when it stands MIN_SWITCH_SE standard errors above zero."""
        pairs = [(self.samples.after.get((kind, other), []), self.samples.after.get((kind, kind), []))
                 for kind, other in (("decode", "round"), ("round", "decode"))]
        if any(len(x) < 2 for pair in pairs for x in pair):
            return 0.0, 0.0, 0.0
        extra = sum(float(np.mean(switched) - np.mean(same)) for switched, same in pairs) / 2
        se = float(np.sqrt(sum(np.var(x, ddof=1) / len(x) for pair in pairs for x in pair)) / 2)
        return (extra if extra > MIN_SWITCH_SE * se else 0.0), extra, se


def draft_from_fused(steps: dict[int, float], decode_ms: list, block_size: int, padding: str) -> float:
    """Per draft token: what a fused step (c classic rows, one speculative row) costs beyond its
    forward, priced by the fitted decode steps as `padding` says (ragged or padded), over K - 1."""
    from mocks import CostModel

    forward = CostModel(decode_ms=decode_ms, fused_padding=padding)
    extra = [step - forward.fused_forward(c, [block_size]) for c, step in steps.items()]
    return max(float(np.mean(extra)) / (block_size - 1), 0.0)
