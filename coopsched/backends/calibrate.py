"""Probes of the MLX backend for `coopsched calibrate` (the command: harness/calibrate/cli.py).

`measure`: medians of direct backend calls: prefill vs prompt length (with and
without the drafter), decode step vs batch size, draft per token, verify vs
width, in mocks.cost.CostModel's field names. `calibration_error`: a
concurrency2-like run of the calibrated mock (virtual time) against the MLX
backend (real time).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable

import numpy as np

from coopsched.core.request import SamplingParams

PREFILL_LENGTHS = (8, 32, 128)
DECODE_BATCHES = (1, 2, 4, 8)
WINDOW_ROWS = (2, 4, 8)
CONTEXT = 32  # prompt tokens behind every decode, draft and verify measurement
METRICS = ("round_ms", "decode_ms", "classic_itl_ms", "classic_stall_ms")


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _prompt(n: int, offset: int = 0) -> list[int]:
    return [32 + (offset + 7 * i) % 90 for i in range(n)]


class _Points:
    """Measurement points sampled round-robin, so load from elsewhere on the machine
    spreads over all of them instead of skewing whichever ran during it."""

    def __init__(self) -> None:
        self.points: dict[str, Callable[[], list[float]]] = {}

    def add(self, label: str, sample: Callable[[], list[float]]) -> None:
        self.points[label] = sample

    def run(self, repeats: int, advance: Callable[[str], None]) -> dict[str, float]:
        samples: dict[str, list[float]] = {label: [] for label in self.points}
        for sample in self.points.values():  # warm-up: first-call allocations, lazy loads
            sample()
        for i in range(repeats):
            for label, sample in self.points.items():
                samples[label].extend(sample())
            advance(f"round {i + 1}/{repeats}")
        return {label: statistics.median(xs) for label, xs in samples.items()}


class _Probe:
    """Sampling closures over one backend: each returns timings (ms) of one visit."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.params = SamplingParams()
        self.live: list[str] = []
        self._ids = iter(f"cal{i}" for i in range(1_000_000))

    def start(self, num_rows: int, with_draft: bool, offset: int = 0) -> list[list]:
        """Live rows [seq_id, last token] with CONTEXT-token prompts, released by close()."""
        ids = [next(self._ids) for _ in range(num_rows)]
        self.live.extend(ids)
        return [[s, self.backend.prefill(s, _prompt(CONTEXT, offset + i), self.params, with_draft)]
                for i, s in enumerate(ids)]

    def close(self) -> None:
        for seq_id in self.live:
            self.backend.release(seq_id)

    def prefill(self, num_tokens: int, with_draft: bool):
        def sample():
            seq_id = next(self._ids)
            ms = _timed(lambda: self.backend.prefill(seq_id, _prompt(num_tokens), self.params, with_draft))
            self.backend.release(seq_id)
            return [ms]
        return sample

    def decode(self, rows: list[list]):
        def step():  # the batch really advances, as classic decoding does
            for row, token in zip(rows, self.backend.decode([tuple(r) for r in rows])):
                row[1] = token

        def sample():
            step()  # untimed: another point may have broken up this batch since its last visit
            return [_timed(step) for _ in range(3)]
        return sample

    def draft(self, row: list, num_drafts: int):
        # Each call re-drafts from the same context: the drafter trims its own stale proposals.
        return lambda: [_timed(lambda: self.backend.draft([tuple(row)], num_drafts)) / num_drafts]

    def verify(self, rows: list[list], width: int):
        def sample():
            ms = _timed(lambda: self.backend.verify([(s, t, [t] * (width - 1)) for s, t in rows]))
            for seq_id, _ in rows:
                self.backend.rewind(seq_id, width)
            return [ms]
        return sample


def measure(backend, block_size: int = 4, repeats: int = 15, advance: Callable[[str], None] | None = None) -> dict:
    """A cost profile (CostModel fields) measured on `backend` (an MlxBackend with a drafter).

    Medians; decode and verify are then made non-decreasing in size (more work never costs
    less; a dip is noise).
    """
    probe, points = _Probe(backend), _Points()
    for n in PREFILL_LENGTHS:
        points.add(f"prefill {n}", probe.prefill(n, False))
        points.add(f"prefill+draft {n}", probe.prefill(n, True))
    for batch in DECODE_BATCHES:
        points.add(f"decode {batch}", probe.decode(probe.start(batch, False)))
    session = probe.start(1, True, offset=50)
    points.add("draft", probe.draft(session[0], block_size - 1))
    widths = [*range(1, block_size + 1), *(r * block_size for r in WINDOW_ROWS)]
    for width in range(1, block_size + 1):  # B = 1: last + width-1 drafts
        points.add(f"verify {width}", probe.verify(session, width))
    for num_rows in WINDOW_ROWS:  # a window: num_rows rows of K positions
        points.add(f"verify {num_rows * block_size}", probe.verify(probe.start(num_rows, True, 60), block_size))
    try:
        ms = points.run(repeats, advance or (lambda _label: None))
    finally:
        probe.close()
    plain = [ms[f"prefill {n}"] for n in PREFILL_LENGTHS]
    both = [ms[f"prefill+draft {n}"] for n in PREFILL_LENGTHS]
    per_token, fixed = np.polyfit(PREFILL_LENGTHS, plain, 1)
    draft_prefill = np.polyfit(PREFILL_LENGTHS, np.subtract(both, plain), 1)[0]
    return {
        "prefill_fixed_ms": round(max(float(fixed), 0.0), 4),
        "prefill_per_token_ms": round(max(float(per_token), 0.0), 5),
        "draft_prefill_per_token_ms": round(max(float(draft_prefill), 0.0), 5),
        "decode_ms": _monotone(DECODE_BATCHES, [ms[f"decode {b}"] for b in DECODE_BATCHES]),
        "draft_per_token_ms": round(ms["draft"], 4),
        "verify_ms": _monotone(widths, [ms[f"verify {w}"] for w in widths]),
    }


def _monotone(sizes, values) -> list[list[float]]:
    return [[size, round(float(v), 4)] for size, v in zip(sizes, np.maximum.accumulate(values))]


# -- the calibrated mock against the MLX backend, on a concurrency2-like run ---------------
def concurrency2_requests(prompt_of: Callable[[int, int], list[int]] = _prompt):
    from coopsched.core.request import Request

    return [Request("classic", tuple(prompt_of(16, 1)), max_tokens=128, speculative=False, arrival_ms=0),
            Request("spec", tuple(prompt_of(32, 2)), max_tokens=96, arrival_ms=40)]


def _run_stats(backend, clock, block_size: int = 4) -> dict:
    from coopsched.core.config import SchedulerConfig
    from coopsched.core.scheduler import Scheduler
    from coopsched.engine import Engine

    scheduler = Scheduler(SchedulerConfig(mode="slice", block_size=block_size))
    times: dict[str, list[float]] = {}

    def record(event) -> None:
        times.setdefault(event.seq_id, []).extend([event.time_ms] * len(event.token_ids))
    result = Engine(scheduler, backend, clock, on_event=record).run(concurrency2_requests())
    walls = lambda kind: [t.end_ms - t.start_ms for t in result.ticks if t.action == kind]
    classic = times.get("classic", [])
    obs = scheduler.obs
    itl = [b - a for a, b in itertools.pairwise(classic)]
    return {"round_ms": walls("spec_round"), "decode_ms": walls("decode"), "classic_itl_ms": itl,
            "classic_stall_ms": [max(itl, default=0.0)],
            "acceptance": [obs.accepted_tokens / obs.drafted_tokens if obs.drafted_tokens else 0.0]}


def _summary(samples: list[float]) -> dict:
    if not samples:
        return {"mean": None, "p99": None}
    return {"mean": round(float(np.mean(samples)), 4), "p99": round(float(np.percentile(samples, 99)), 4)}


def _continuation_prob(rate: float, num_drafts: int) -> float:
    """The mock drafter's per-token continuation probability p whose expected accepted share
    (p + p^2 + ... + p^n) / n equals the measured acceptance rate."""
    low, high = 0.0, 1.0
    for _ in range(50):
        p = (low + high) / 2
        share = sum(p ** i for i in range(1, num_drafts + 1)) / num_drafts
        low, high = (p, high) if share < rate else (low, p)
    return (low + high) / 2


def calibration_error(profile: dict, backend, runs: int = 3, block_size: int = 4) -> dict:
    """Round time, decode step, classic ITL and classic stall (the largest ITL of a run), mean
    and p99: MLX (samples pooled over `runs` real-time runs) vs the calibrated mock in virtual
    time, and the mock's relative error (mock / mlx - 1)."""
    from coopsched.clock import ManualClock, RealClock
    from mocks import CostModel, MockBackend, MockDrafter

    real: dict[str, list] = {}
    for _ in range(runs):
        for metric, values in _run_stats(backend.fresh(), RealClock(), block_size).items():
            real.setdefault(metric, []).append(values)
    acceptance = float(np.mean(real.pop("acceptance")))
    real = {metric: [v for run in runs_ for v in run] for metric, runs_ in real.items()}
    clock = ManualClock()
    cost = CostModel(**{k: v for k, v in profile.items() if k in CostModel.__dataclass_fields__})
    drafter = MockDrafter(_continuation_prob(acceptance, block_size - 1))
    virtual = _run_stats(MockBackend(clock, cost, drafter=drafter), clock, block_size)
    out = {"acceptance": round(acceptance, 4), "runs": runs}
    for metric in METRICS:
        mlx_s, mock_s = _summary(real[metric]), _summary(virtual[metric])
        error = {k: (round(mock_s[k] / mlx_s[k] - 1, 4) if mlx_s[k] and mock_s[k] is not None else None)
                 for k in ("mean", "p99")}
        out[metric] = {"mlx": mlx_s, "mock": mock_s, "error": error}
    return out
