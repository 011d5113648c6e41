"""The mock's cost model, in ms: every knob explicit, bounds computed from its terms.

decode step and verify are piecewise-linear in batch size and width (from a
calibrated profile or defaults); optional seeded jitter scales every charge by
up to +/- `jitter`. A profile is JSON with the same field names.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np


def _interp(points: list[list[float]], x: float) -> float:
    """Piecewise linear through the points, extended linearly past the last one."""
    xs, ys = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    if len(xs) > 1 and x > xs[-1]:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "_memo", {})  # decode and verify by size: pure, asked every tick
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError(f"jitter={self.jitter} must be within [0, 1)")
        for name in ("decode_ms", "verify_ms"):
            points = getattr(self, name)
            if not points or any(len(p) != 2 or p[1] < 0 for p in points):
                raise ValueError(f"{name}={points!r}: want a non-empty list of [size, ms >= 0] pairs")

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
    def prefill(self, num_tokens: int, with_draft: bool = False) -> float:
        draft = self.draft_prefill_per_token_ms * num_tokens if with_draft else 0.0
        return self.prefill_fixed_ms + self.prefill_per_token_ms * num_tokens + draft

    def decode(self, batch_size: int) -> float:
        key = ("decode", batch_size)
        if key not in self._memo:
            self._memo[key] = _interp(self.decode_ms, batch_size)
        return self._memo[key]

    def draft(self, num_tokens: int) -> float:
        return self.draft_per_token_ms * num_tokens

    def verify(self, width: int) -> float:
        key = ("verify", width)
        if key not in self._memo:
            self._memo[key] = _interp(self.verify_ms, width)
        return self._memo[key]

    def round(self, block_size: int, rows: int = 1) -> float:
        """One speculative round: K-1 drafts (rows drafted together) and one verify of rows*K."""
        return self.draft(block_size - 1) + self.verify(rows * block_size)

    def slice0(self, prompt_len: int) -> float:
        return self.prefill(prompt_len, with_draft=True)

    # -- chunked and batched prefill (issue 12): priced from the prefill terms, no knob of its own --
    def prefill_batch(self, spans: Sequence[tuple[int, bool]]) -> float:
        """ONE prefill forward over several rows' spans, each (tokens, with_draft): whole prompts
        or chunks. The fixed cost is paid once per forward (what batching saves, and what each
        extra chunk costs); every token at the per-token price, drafter rows also at the draft
        prefill price. Unpadded (ragged) rows; a chunk's attention over earlier chunks is not
        priced (linear in tokens): calibration may add terms, defaulting to today's prices."""
        if not spans:
            return 0.0
        tokens = sum(n for n, _ in spans)
        draft = sum(n for n, with_draft in spans if with_draft)
        return self.prefill_fixed_ms + self.prefill_per_token_ms * tokens + self.draft_prefill_per_token_ms * draft

    def chunk(self, num_tokens: int, with_draft: bool = False) -> float:
        """One full chunk of `num_tokens` (the most a prefill tick costs under that budget)."""
        return self.prefill_batch([(num_tokens, with_draft)])

    @property
    def max_jitter_factor(self) -> float:
        return 1.0 + self.jitter

    def jittered(self, rng: random.Random, ms: float) -> float:
        return ms * (1.0 + rng.uniform(-self.jitter, self.jitter)) if self.jitter else ms
