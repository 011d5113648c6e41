"""The one comparison rule: a metric is worse when it moved in its bad direction by more than
the threshold (relative to the base); a percentile over fewer than `min_samples` samples is
reported but advisory. `coopsched compare`, `coopsched report` and the bench gate all judge
with `judge` and `compare_tables`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

ABS_EPS = 1e-9  # a zero base tolerates float dust, not a real change
VERDICTS = ("worse", "better", "same", "missing", "new", "advisory")
REGRESSED = ("worse", "missing")  # `missing`: the base had the metric (or the key), the new run has not


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    higher_is_better: bool
    title: str
    percentile: bool = False       # the sample-size rule applies


@dataclass(frozen=True)
class Row:
    key: str                       # scenario/mode, mode/load, or the mode (capacity)
    metric: str
    base: float | None
    new: float | None
    delta_pct: float | None        # (new - base) / |base| x 100; None without both or with a zero base
    regressed: bool
    verdict: str                   # one of VERDICTS
    samples: int | None = None     # the fewer of the two sides' samples behind a percentile

    def to_json(self) -> dict:
        return asdict(self)


def delta_pct(base: float | None, new: float | None) -> float | None:
    if base is None or new is None or base == 0:
        return None
    return round((new - base) / abs(base) * 100.0, 3)


def judge(higher_is_better: bool, base: float | None, new: float | None, threshold: float,
          samples: int | None = None, min_samples: int = 0) -> str:
    """worse (beyond `threshold`, a fraction, in the bad direction), better, same, missing, new, or
    advisory (worse, but over fewer than min_samples samples: too few to gate on)."""
    if base is None and new is None:
        return "same"
    if new is None:
        return "missing"
    if base is None:
        return "new"
    bad = base - new if higher_is_better else new - base
    if bad > threshold * abs(base) + ABS_EPS:
        return "advisory" if samples is not None and samples < min_samples else "worse"
    return "better" if bad < -ABS_EPS else "same"


Table = Mapping[str, Mapping[str, float | None]]  # key -> metric -> value


def compare_tables(base: Mapping[str, Mapping], new: Mapping[str, Mapping], metrics: Iterable[Metric],
                   threshold: float, samples: Mapping[str, Mapping[str, int | None]] | None = None,
                   min_samples: int = 0) -> list[Row]:
    """A row per metric of every key in either side, keys sorted. A key the base lacks is `new`
    (not judged); one the new side lacks is `missing` in every metric, and counts as a regression."""
    metrics = tuple(metrics)
    rows = []
    for key in sorted(set(base) | set(new)):
        then, now = base.get(key), new.get(key)
        for m in metrics:
            b = then.get(m.name) if then is not None else None
            n = now.get(m.name) if now is not None else None
            count = (samples or {}).get(key, {}).get(m.name) if m.percentile else None
            if then is None:
                verdict = "new"
            elif now is None:
                verdict = "missing"
            else:
                verdict = judge(m.higher_is_better, b, n, threshold, count, min_samples)
            rows.append(Row(key, m.name, b, n, delta_pct(b, n), verdict in REGRESSED, verdict, count))
    return rows


def regressions(rows: Iterable[Row]) -> list[Row]:
    return [r for r in rows if r.regressed]
