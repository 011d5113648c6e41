"""The mock's cost model, in ms: every knob explicit, bounds computed from its terms.

decode step and verify are piecewise-linear in batch size and width (from a
calibrated profile or defaults); optional seeded jitter scales every charge by
up to +/- `jitter`. A profile is JSON with the same field names.

The fidelity terms (a whole round as one term, how a fused forward is padded, a
classic/speculative switch overhead, fitted per-term jitter, the drafter's
measured acceptance, a prompt's fixed cost inside a decode step's forward) each
default to the price the mock charged before them, so old profiles and scenarios
keep their meaning; `coopsched calibrate` fits them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np

JITTER_TERMS = ("prefill", "decode", "draft", "verify", "fused")  # one per MockBackend call
FUSED_PADDINGS = ("ragged", "padded", "split")


def _interp(points: list[list[float]], x: float) -> float:
    """Piecewise linear through the points, extended linearly past the last one, never downward: a
    profile whose last two points fall (a noisy fit) priced 25 rows under 8 and a twin's capacity
    at 2.8x its server's."""
    xs, ys = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    if len(xs) > 1 and x > xs[-1]:
        slope = max((ys[-1] - ys[-2]) / (xs[-1] - xs[-2]), 0.0)
        return float(ys[-1] + slope * (x - xs[-1]))
    return float(np.interp(x, xs, ys))


@dataclass(frozen=True)
class CostModel:
    prefill_fixed_ms: float = 2.0
    prefill_per_token_ms: float = 0.2
    draft_prefill_per_token_ms: float = 0.05
    decode_ms: list = field(default_factory=lambda: [[1, 5.0], [64, 36.5]])  # [batch, ms]
    draft_per_token_ms: float = 2.0
    verify_ms: list = field(default_factory=lambda: [[1, 5.0], [256, 770.0]])  # [width, ms]
    jitter: float = 0.0
    seed: int = 0
    # -- fidelity terms (calibrate): each default is the price charged before them --------
    round_ms: list | None = None          # [K, ms] of a whole one-row round; None: draft + verify
    fused_padding: str = "ragged"         # what a fused forward computes: ragged | padded | split
    switch_ms: float = 0.0                # a switch between the classic and the speculative path
    jitter_quantiles: dict | None = None  # term -> quantiles of charge / mean charge; None: uniform `jitter`
    accept_prob: float | None = None      # the drafter's acceptance measured with this profile
    context_per_token_ms: float = 0.0     # a decode/verify position's attention: ms per token its row has cached
    shared_prefill_fixed_ms: float | None = None  # a prefill's fixed cost in a decode step's forward (None: the same)
    draft_position_ms: float | None = None  # a verified draft position in a row's forward (None: a decode row's)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_memo", {})  # decode and verify by size: pure, asked every tick
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError(f"jitter={self.jitter} must be within [0, 1)")
        for name in ("decode_ms", "verify_ms"):
            points = getattr(self, name)
            if not points or any(len(p) != 2 or p[1] < 0 for p in points):
                raise ValueError(f"{name}={points!r}: want a non-empty list of [size, ms >= 0] pairs")
        self._check_fidelity_terms()

    @classmethod
    def simple(cls, decode_ms: float = 5.0, round_ms: float = 30.0,
               prefill_ms_per_token: float = 0.2, block_size: int = 4) -> CostModel:
        """Flat costs: every decode step `decode_ms`, every B = 1 round of K `round_ms`."""
        return cls(prefill_fixed_ms=0.0, prefill_per_token_ms=prefill_ms_per_token,
                   draft_prefill_per_token_ms=0.0, decode_ms=[[1, decode_ms]],
                   draft_per_token_ms=0.0, verify_ms=[[1, round_ms], [block_size, round_ms]])

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read cost profile {path}: {exc}") from exc
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_json(self) -> dict:
        return asdict(self)

    # -- terms the bounds are built from (no jitter) --------------------------
    def prefill(self, num_tokens: int, with_draft: bool = False, shared: bool = False) -> float:
        draft = self.draft_prefill_per_token_ms * num_tokens if with_draft else 0.0
        return self.prefill_fixed(shared) + self.prefill_per_token_ms * num_tokens + draft

    def prefill_fixed(self, shared: bool = False) -> float:
        """A prefill's fixed cost: a forward's own, or `shared` (decode or verify rows in the same
        forward, one forward a step as vLLM runs) `shared_prefill_fixed_ms`, by default the same."""
        if shared and self.shared_prefill_fixed_ms is not None:
            return self.shared_prefill_fixed_ms
        return self.prefill_fixed_ms

    def decode(self, batch_size: int) -> float:
        key = ("decode", batch_size)
        ms = self._memo.get(key)
        if ms is None:
            ms = self._memo[key] = _interp(self.decode_ms, batch_size)
        return ms

    def draft(self, num_tokens: int) -> float:
        return self.draft_per_token_ms * num_tokens

    def context(self, cached_positions: int) -> float:
        """What the rows' attention over their caches adds to a decode, verify or fused forward:
        `cached_positions` is the sum over the forward's positions of the tokens their row holds
        (a decode row counts its cache once, a verify row of K positions K times). 0 by default:
        a profile fitted without it prices a step by its width alone."""
        return self.context_per_token_ms * cached_positions

    def verify(self, width: int) -> float:
        key = ("verify", width)
        ms = self._memo.get(key)
        if ms is None:
            ms = self._memo[key] = _interp(self.verify_ms, width)
        return ms

    def round(self, block_size: int, rows: int = 1) -> float:
        """One speculative round: K-1 drafts (rows drafted together) and one verify of rows*K
        (or, when the profile has the whole-round term, `round_ms` at K plus the verify of the
        other rows' positions; with `draft_position_ms`, the verify priced as the mock charges it)."""
        if self.round_ms is not None:
            return self._round_total(block_size, rows)
        return self.draft(block_size - 1) + self.verify_charge(rows * block_size, block_size - 1, rows)

    def slice0(self, prompt_len: int) -> float:
        return self.prefill(prompt_len, with_draft=True)

    # -- chunked and batched prefill: priced from the prefill terms, no knob of its own --
    def prefill_batch(self, spans: Sequence[tuple[int, bool]], shared: bool = False) -> float:
        """ONE prefill forward over several rows' spans, each (tokens, with_draft): whole prompts
        or chunks. The fixed cost is paid once per forward (what batching saves, and what each
        extra chunk costs; `prefill_fixed`, `shared` with decode rows); every token at the per-token
        price, drafter rows also at the draft prefill price. Unpadded (ragged) rows; a chunk's
        attention over earlier chunks is not priced (linear in tokens): calibration may add terms,
        defaulting to today's prices."""
        if not spans:
            return 0.0
        tokens = sum(n for n, _ in spans)
        draft = sum(n for n, with_draft in spans if with_draft)
        return (self.prefill_fixed(shared) + self.prefill_per_token_ms * tokens
                + self.draft_prefill_per_token_ms * draft)

    def chunk(self, num_tokens: int, with_draft: bool = False) -> float:
        """One full chunk of `num_tokens` (the most a prefill tick costs under that budget)."""
        return self.prefill_batch([(num_tokens, with_draft)])

    def mixed(self, chunk_tokens: int, num_decode: int, with_draft: bool = False) -> float:
        """The mixed step: ONE forward over one chunk of a prompt and the decode rows. Priced from
        the two terms it joins (the chunk's prefill, its fixed cost `shared`, and a decode step of the
        rows); by default no saving is priced for sharing the weights, so the step changes who waits,
        not what the work costs."""
        chunk = self.prefill_batch([(chunk_tokens, with_draft)], shared=num_decode > 0)
        return chunk + (self.decode(num_decode) if num_decode else 0.0)

    @property
    def max_jitter_factor(self) -> float:
        fitted = [q[-1] for q in (self.jitter_quantiles or {}).values()]
        return max([1.0 + self.jitter, *fitted])

    def jittered(self, rng: random.Random, ms: float, term: str | None = None) -> float:
        """`ms` scaled by a seeded draw: from the term's fitted quantiles when the profile has
        them, else uniform within +/- `jitter` (no draw at all when both are off)."""
        quantiles = self.jitter_quantiles.get(term) if self.jitter_quantiles and term else None
        if quantiles:
            return ms * _inverse_cdf(quantiles, rng.random())
        return ms * (1.0 + rng.uniform(-self.jitter, self.jitter)) if self.jitter else ms

    # -- fidelity terms ---------------------------------------------------------
    def _check_fidelity_terms(self) -> None:
        if self.round_ms is not None and (not self.round_ms or any(len(p) != 2 or p[1] < 0 for p in self.round_ms)):
            raise ValueError(f"round_ms={self.round_ms!r}: want null or a non-empty list of [K, ms >= 0] pairs")
        if self.fused_padding not in FUSED_PADDINGS:
            raise ValueError(f"fused_padding={self.fused_padding!r}: want one of {', '.join(FUSED_PADDINGS)}")
        if not self.switch_ms >= 0:
            raise ValueError(f"switch_ms={self.switch_ms} must be >= 0")
        if not self.context_per_token_ms >= 0:
            raise ValueError(f"context_per_token_ms={self.context_per_token_ms} must be >= 0")
        if self.shared_prefill_fixed_ms is not None and not self.shared_prefill_fixed_ms >= 0:
            raise ValueError(f"shared_prefill_fixed_ms={self.shared_prefill_fixed_ms} must be >= 0 (or null)")
        if self.draft_position_ms is not None and not self.draft_position_ms >= 0:
            raise ValueError(f"draft_position_ms={self.draft_position_ms} must be >= 0 (or null)")
        if self.accept_prob is not None and not 0.0 <= self.accept_prob <= 1.0:
            raise ValueError(f"accept_prob={self.accept_prob} must be within [0, 1] (or null)")
        for term, qs in (self.jitter_quantiles or {}).items():
            if term not in JITTER_TERMS:
                raise ValueError(f"jitter_quantiles: unknown term {term!r}; want {', '.join(JITTER_TERMS)}")
            if len(qs) < 2 or qs[0] < 0 or any(b < a for a, b in pairwise(qs)):
                raise ValueError(f"jitter_quantiles[{term!r}]={qs!r}: want >= 2 non-decreasing factors >= 0")

    def _round_total(self, block_size: int, rows: int) -> float:
        """The whole-round term: one row's round of K, plus a window's other rows (their verify width)."""
        key = ("round", block_size, rows)
        if key not in self._memo:
            extra = self.verify(rows * block_size) - self.verify(block_size) if rows > 1 else 0.0
            self._memo[key] = _interp(self.round_ms, block_size) + extra
        return self._memo[key]

    def verify_charge(self, width: int, num_drafts: int, rows: int = 0) -> float:
        """What a verify of `width` positions over `rows` rows costs after `num_drafts` drafts per
        row: with `draft_position_ms`, a forward of its rows plus its draft positions; else `verify`,
        or with a whole-round term, what the round leaves once the drafts are paid."""
        if self.draft_position_ms is not None and rows:
            return self.ragged(rows, width - rows)
        if self.round_ms is None:
            return self.verify(width)
        k = num_drafts + 1
        return max(self._round_total(k, max(width // k, 1)) - self.draft(num_drafts), 0.0)

    def ragged(self, rows: int, draft_positions: int) -> float:
        """One forward over `rows` rows holding `draft_positions` draft tokens beside each row's own
        position: a decode of every position, or with `draft_position_ms` (a draft token riding the
        forward as a prompt token does, vLLM's step) a decode of the rows plus that per draft."""
        if self.draft_position_ms is None:
            return self.decode(rows + draft_positions)
        return self.decode(rows) + self.draft_position_ms * draft_positions

    def fused_forward(self, num_classic: int, widths: list[int]) -> float:
        """One fused forward over `num_classic` decode rows and verify rows of `widths` positions:
        ragged = a decode step of every real position (the default); padded = every row padded
        to the widest (what one dense batch computes); split = a decode of the classic rows, then
        a verify of the speculative ones (two forwards in one tick)."""
        if not widths:
            return self.decode(num_classic)
        if self.fused_padding == "padded":
            return self.decode((num_classic + len(widths)) * max(widths))
        if self.fused_padding == "split":
            verify = self.verify_charge(sum(widths), max(widths) - 1, len(widths))
            return (self.decode(num_classic) if num_classic else 0.0) + verify
        return self.ragged(num_classic + len(widths), sum(widths) - len(widths))

    def fused_step(self, num_classic: int, block_size: int, rows: int = 1) -> float:
        """A fused tick: K-1 drafts, then one fused forward (bounds use it)."""
        return self.draft(block_size - 1) + self.fused_forward(num_classic, [block_size] * rows)


def _inverse_cdf(quantiles: list[float], u: float) -> float:
    """The factor at probability u of a distribution given by quantiles at evenly spaced
    probabilities 0, 1/(n-1), ..., 1 (piecewise linear between them)."""
    pos = u * (len(quantiles) - 1)
    i = min(int(pos), len(quantiles) - 2)
    return quantiles[i] + (quantiles[i + 1] - quantiles[i]) * (pos - i)


def quantile_mean(quantiles: list[float]) -> float:
    """The mean of the distribution `_inverse_cdf` draws from (trapezoids between the quantiles)."""
    n = len(quantiles) - 1
    return (sum(quantiles) - (quantiles[0] + quantiles[-1]) / 2) / n
