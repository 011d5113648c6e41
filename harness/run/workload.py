"""Workloads: a scenario's `[workload]` table, turned into requests for one seed.

Open loop (poisson, gamma, constant) fixes every arrival up front; a closed loop
has `concurrency` users, each sending the next request the instant its previous
one finishes (`ClosedLoop`, fed by the engine's finish events); `trace` replays a
file (harness/run/trace_formats.py). Same seed, same requests: numpy Generators, one salt per purpose.
"""

from __future__ import annotations

import json
import math
import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from coopsched.core import Priority, Request, SamplingParams
from coopsched.engine import Arrivals
from harness.run import trace_formats
from harness.run.trace_formats import FORMATS as TRACE_FORMATS
from harness.run.trace_formats import TraceError, TraceLine

ARRIVALS = ("poisson", "gamma", "constant", "closed")
KEYS = ("num_requests", "arrival", "rate_per_s", "burstiness", "concurrency", "start_ms", "prompt_len",
        "max_tokens", "speculative_share", "accept_prob", "trace", "trace_format", "speedup")
TRACE_KEYS = ("trace", "trace_format", "speedup", "num_requests", "start_ms", "max_tokens", "speculative_share",
              "accept_prob")  # the file gives the rest
DEFAULT_PROMPT_LEN = 16  # RequestSpec's defaults
DEFAULT_MAX_TOKENS = 64
SALTS = {"arrival": 1, "prompt_len": 2, "max_tokens": 3, "speculative": 4}  # one stream per purpose


@dataclass(frozen=True)
class RequestSpec:
    id: str
    arrival_ms: float = 0.0
    prompt_len: int = 16
    prompt: str | None = None
    max_tokens: int = 64
    speculative: bool = True
    priority: str = "normal"
    temperature: float = 0.0
    stop: tuple[str, ...] = ()
    accept_script: tuple[int, ...] = ()
    hash_ids: tuple[int, ...] | None = None  # a replayed Mooncake line's prefix-block hashes

    def prompt_tokens(self, seed: int) -> tuple[int, ...]:
        if self.prompt is not None:
            return tuple(self.prompt.encode("utf-8"))
        rng = random.Random(f"prompt:{seed}:{self.id}")
        return tuple(rng.randrange(32, 127) for _ in range(self.prompt_len))

    def build(self, seed: int, speculative: bool | None = None) -> Request:
        return Request(
            id=self.id, prompt_token_ids=self.prompt_tokens(seed), max_tokens=self.max_tokens,
            sampling=SamplingParams(self.temperature, seed if self.temperature > 0 else None),
            stop=self.stop, speculative=self.speculative if speculative is None else speculative,
            priority=Priority[self.priority.upper()], arrival_ms=self.arrival_ms)


class WorkloadError(ValueError):
    """A [workload] table or trace file that cannot be run; the message names the value."""


def _toml(value) -> str:
    """A value spelled about as TOML spells it ("text", 1.5, true, {"min": 1})."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _show(table: dict, key: str) -> str:
    """`key = value`, or that the key is missing."""
    return f"{key} = {_toml(table[key])}" if key in table else f"{key} is missing"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Lengths:
    """A token count: fixed, uniform integers in [min, max], or lognormal with mean `mean`."""
    fixed: int | None = None
    low: int | None = None
    high: int | None = None
    mean: float | None = None
    sigma: float | None = None

    @classmethod
    def parse(cls, key: str, value) -> Lengths:
        accepted = "an int >= 1, {min = a, max = b} (uniform integers) or {mean = m, sigma = s} (lognormal)"
        if _is_int(value):
            if value < 1:
                raise WorkloadError(f"[workload] {key} = {value}: must be >= 1 ({accepted})")
            return cls(fixed=value)
        if not isinstance(value, dict):
            raise WorkloadError(f"[workload] {key} = {_toml(value)}: want {accepted}")
        keys = set(value)
        if keys == {"min", "max"}:
            low, high = value["min"], value["max"]
            if not (_is_int(low) and _is_int(high)) or low < 1:
                raise WorkloadError(f"[workload] {key} = {{min = {_toml(low)}, max = {_toml(high)}}}: "
                                    "min and max must be ints >= 1")
            if low > high:
                raise WorkloadError(f"[workload] {key}: min = {low} > max = {high}")
            return cls(low=low, high=high)
        if keys == {"mean", "sigma"}:
            mean, sigma = value["mean"], value["sigma"]
            if not (_is_number(mean) and mean > 0 and _is_number(sigma) and sigma >= 0):
                raise WorkloadError(f"[workload] {key} = {{mean = {_toml(mean)}, sigma = {_toml(sigma)}}}: "
                                    "mean must be a number > 0 and sigma a number >= 0")
            return cls(mean=float(mean), sigma=float(sigma))
        raise WorkloadError(f"[workload] {key} has keys {', '.join(sorted(keys)) or '(none)'}: want {accepted}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.fixed is not None:
            return np.full(n, self.fixed, dtype=np.int64)
        if self.low is not None:
            return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)
        mu = math.log(self.mean) - self.sigma ** 2 / 2  # so that the lengths' mean is `mean`
        return np.maximum(np.rint(rng.lognormal(mu, self.sigma, n)), 1).astype(np.int64)


@dataclass(frozen=True)
class Workload:
    arrival: str                       # one of ARRIVALS, or "trace" for a replay
    num_requests: int
    rate_per_s: float | None = None
    burstiness: float = 1.0
    concurrency: int | None = None
    start_ms: float = 0.0
    prompt_len: Lengths = Lengths(fixed=DEFAULT_PROMPT_LEN)
    max_tokens: Lengths = Lengths(fixed=DEFAULT_MAX_TOKENS)
    speculative_share: float = 1.0
    accept_prob: float | None = None
    trace: tuple[TraceLine, ...] = ()
    speedup: float = 1.0               # a replay's arrivals are divided by it (a rate sweep sets it)
    max_tokens_cap: int | None = None  # a replay's budget cap (and the budget of lines that give none)
    trace_share: float | None = None   # eligible share of the lines that do not say; None: all of them
    notes: tuple[str, ...] = ()        # what reading the trace left out

    @classmethod
    def parse(cls, table: dict, base_dir: Path) -> Workload:
        if not isinstance(table, dict):
            raise WorkloadError(f"workload = {_toml(table)}: want a [workload] table")
        unknown = sorted(set(table) - set(KEYS))
        if unknown:
            raise WorkloadError(f"[workload] unknown key {', '.join(map(repr, unknown))}; accepted: {', '.join(KEYS)}")
        common = {"start_ms": _start_ms(table), "accept_prob": _share(table, "accept_prob", None),
                  "max_tokens": Lengths.parse("max_tokens", table.get("max_tokens", DEFAULT_MAX_TOKENS))}
        if "trace" in table:
            return cls._replay(table, base_dir, common)
        arrival = table.get("arrival")
        if arrival not in ARRIVALS:
            raise WorkloadError(f"[workload] {_show(table, 'arrival')}: want one of {', '.join(ARRIVALS)} "
                                "(or trace = \"FILE.jsonl\" to replay a file)")
        num = table.get("num_requests")
        if not _is_int(num) or num < 1:
            raise WorkloadError(f"[workload] {_show(table, 'num_requests')}: want an int >= 1")
        fields = dict(common, prompt_len=Lengths.parse("prompt_len", table.get("prompt_len", DEFAULT_PROMPT_LEN)),
                      speculative_share=_share(table, "speculative_share", 1.0))
        if arrival == "closed":
            _refuse(table, arrival, ("rate_per_s", "burstiness"))
            concurrency = table.get("concurrency")
            if not _is_int(concurrency) or concurrency < 1:
                raise WorkloadError(f"[workload] {_show(table, 'concurrency')}: arrival = \"closed\" wants "
                                    "an int >= 1 (the number of users)")
            return cls(arrival, num, concurrency=concurrency, **fields)
        _refuse(table, arrival, ("concurrency",) + (() if arrival == "gamma" else ("burstiness",)))
        rate = table.get("rate_per_s")
        if not _is_number(rate) or rate <= 0:
            raise WorkloadError(f"[workload] {_show(table, 'rate_per_s')}: arrival = \"{arrival}\" wants a "
                                "number > 0 (mean requests per second)")
        burstiness = table.get("burstiness", 1.0)
        if not _is_number(burstiness) or burstiness <= 0:
            raise WorkloadError(f"[workload] {_show(table, 'burstiness')}: want a number > 0 (gamma shape; "
                                "1 = Poisson, < 1 burstier, > 1 more regular)")
        return cls(arrival, num, rate_per_s=float(rate), burstiness=float(burstiness), **fields)

    @classmethod
    def _replay(cls, table: dict, base_dir: Path, common: dict) -> Workload:
        extra = sorted(set(table) - set(TRACE_KEYS))
        if extra:
            raise WorkloadError(f"[workload] {_show(table, 'trace')} gives arrivals and lengths: "
                                f"drop {', '.join(extra)} (with a trace: {', '.join(TRACE_KEYS)})")
        fmt = table.get("trace_format", "auto")
        if fmt not in TRACE_FORMATS:
            raise WorkloadError(f"[workload] {_show(table, 'trace_format')}: want one of {', '.join(TRACE_FORMATS)}")
        speedup = table.get("speedup", 1.0)
        if not _is_number(speedup) or speedup <= 0:
            raise WorkloadError(f"[workload] {_show(table, 'speedup')}: want a number > 0 (arrivals are divided by it)")
        cap = table.get("max_tokens")
        if cap is not None and (not _is_int(cap) or cap < 1):
            raise WorkloadError(f"[workload] {_show(table, 'max_tokens')}: beside a trace it is a cap: "
                                "want an int >= 1")
        lines, notes = read_trace(table["trace"], base_dir, fmt)
        num = table.get("num_requests", len(lines))
        if not _is_int(num) or num < 1:
            raise WorkloadError(f"[workload] {_show(table, 'num_requests')}: want an int >= 1 (the first N requests)")
        lines = lines[:num]
        return cls("trace", len(lines), trace=lines, speedup=float(speedup), max_tokens_cap=cap,
                   trace_share=_share(table, "speculative_share", None), notes=notes,
                   **{**common, "max_tokens": Lengths(fixed=cap or DEFAULT_MAX_TOKENS)})

    @property
    def is_closed(self) -> bool:
        return self.arrival == "closed"

    def ids(self) -> list[str]:
        width = max(4, len(str(self.num_requests - 1)))  # zero padded: ids sort in arrival order
        return [f"w{i:0{width}d}" for i in range(self.num_requests)]

    def specs(self, seed: int) -> list:
        """The generated (or replayed) requests for this seed, in arrival order."""
        n, ids = self.num_requests, self.ids()
        if self.trace:
            return self._replay_specs(seed, ids)
        max_tokens = self.max_tokens.sample(_rng(seed, "max_tokens"), n).tolist()
        arrivals = self.arrivals_ms(seed).tolist()
        prompt_len = self.prompt_len.sample(_rng(seed, "prompt_len"), n).tolist()
        eligible = np.zeros(n, dtype=bool)
        eligible[_rng(seed, "speculative").permutation(n)[: round(self.speculative_share * n)]] = True
        return [RequestSpec(i, a, p, None, m, s)
                for i, a, p, m, s in zip(ids, arrivals, prompt_len, max_tokens, eligible.tolist())]

    def _replay_specs(self, seed: int, ids: list[str]) -> list:
        """The trace's lines: arrivals / speedup after start_ms (all at start_ms in a closed loop), budgets
        capped, and exactly round(share x N) of the N lines that do not say chosen eligible."""
        unsaid = np.asarray([i for i, line in enumerate(self.trace) if line.speculative is None], dtype=np.int64)
        eligible = set(unsaid.tolist())
        if self.trace_share is not None:
            eligible = set(unsaid[_rng(seed, "speculative").permutation(unsaid.size)[
                : round(self.trace_share * unsaid.size)]].tolist())
        cap = self.max_tokens_cap or DEFAULT_MAX_TOKENS
        specs = []
        for index, (i, line) in enumerate(zip(ids, self.trace)):
            at = self.start_ms if self.is_closed else round(self.start_ms + line.arrival_ms / self.speedup, 6)
            budget = min(line.max_tokens, cap) if line.max_tokens and self.max_tokens_cap else line.max_tokens or cap
            flag = index in eligible if line.speculative is None else line.speculative
            specs.append(RequestSpec(i, at, line.prompt_len or DEFAULT_PROMPT_LEN, line.prompt, budget, flag,
                                     hash_ids=line.hash_ids))
        return specs

    def arrivals_ms(self, seed: int) -> np.ndarray:
        """Open loop: the first request at start_ms, then gaps of mean 1000 / rate_per_s ms.
        Closed loop: start_ms for all (the first `concurrency` are sent then, the rest on finishes)."""
        n = self.num_requests
        if self.is_closed:
            return np.full(n, self.start_ms)
        mean_gap = 1000.0 / self.rate_per_s
        rng = _rng(seed, "arrival")
        if self.arrival == "constant":
            gaps = np.full(n - 1, mean_gap)
        elif self.arrival == "poisson":
            gaps = rng.exponential(mean_gap, n - 1)
        else:  # gamma: shape k, mean kept; CV of the gaps = 1 / sqrt(k) (vLLM bench's burstiness)
            gaps = rng.gamma(self.burstiness, mean_gap / self.burstiness, n - 1)
        return np.round(self.start_ms + np.concatenate(([0.0], np.cumsum(gaps))), 6)

    def arrivals(self, requests: list[Request]) -> Arrivals | list[Request]:
        """What the engine runs: the list itself, or a ClosedLoop over this workload's requests."""
        if not self.is_closed:
            return requests
        return ClosedLoop(requests, set(self.ids()), self.concurrency, self.start_ms)


class ClosedLoop(Arrivals):
    """`concurrency` users: each sends the next unsent request the instant its previous one
    finishes (the finish event's time). Requests outside the loop keep their own arrival_ms."""

    def __init__(self, requests: Iterable[Request], looped: set[str], concurrency: int, start_ms: float) -> None:
        requests = list(requests)
        super().__init__(r for r in requests if r.id not in looped)
        self._looped = looped
        self._unsent = deque(r for r in requests if r.id in looped)
        for _ in range(min(concurrency, len(self._unsent))):
            self._send(start_ms)

    def _send(self, at_ms: float) -> None:
        request = self._unsent.popleft()
        request.arrival_ms = at_ms
        self.push(request)

    def on_finish(self, event) -> None:
        if event.seq_id in self._looped and self._unsent:
            self._send(event.time_ms)


def _rng(seed: int, purpose: str) -> np.random.Generator:
    return np.random.default_rng([SALTS[purpose], seed % 2 ** 64])  # any int seed, negative too


def _refuse(table: dict, arrival: str, keys: tuple[str, ...]) -> None:
    for key in keys:
        if key in table:
            wants = {"concurrency": 'arrival = "closed"', "burstiness": 'arrival = "gamma"',
                     "rate_per_s": "an open loop (poisson, gamma, constant)"}[key]
            raise WorkloadError(f"[workload] {_show(table, key)} does not apply to arrival = \"{arrival}\"; "
                                f"it needs {wants}")


def _start_ms(table: dict) -> float:
    value = table.get("start_ms", 0.0)
    if not _is_number(value) or value < 0:
        raise WorkloadError(f"[workload] {_show(table, 'start_ms')}: want a number of ms >= 0")
    return float(value)


def _share(table: dict, key: str, default):
    value = table.get(key, default)
    if value is not None and (not _is_number(value) or not 0.0 <= value <= 1.0):
        raise WorkloadError(f"[workload] {_show(table, key)}: want a number within [0, 1]")
    return None if value is None else float(value)


def read_text(path: Path, what: str, error: type[ValueError]) -> str:
    """A file's text, or one clear error naming the file."""
    try:
        return path.read_text()
    except FileNotFoundError:
        raise error(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} {path}: {exc}") from None


def read_trace(name, base_dir: Path, fmt: str = "auto") -> tuple[tuple[TraceLine, ...], tuple[str, ...]]:
    """A replay file (path relative to the scenario file) in any of TRACE_FORMATS: its lines in
    arrival order and the notes on what was left out."""
    if not isinstance(name, str) or not name:
        raise WorkloadError(f"[workload] trace = {json.dumps(name)}: want a path to a trace file")
    path = (base_dir / name).resolve()
    text = read_text(path, "[workload] trace file", WorkloadError)
    try:
        trace = trace_formats.read(path, text, fmt)
    except TraceError as exc:
        raise WorkloadError(str(exc)) from None
    return trace.lines, trace.notes
