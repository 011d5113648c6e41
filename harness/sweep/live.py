"""`coopsched sweep --target URL`: each point is a real-time run against a live server.

Open loop: every request at its arrival offset (harness/live/http_target.py). Closed loop:
`concurrency` user threads, each sending its next request the moment its previous one
ends (explicit [[requests]] keep their own arrivals). Points run one after another. Around
each point /metrics is scraped (when the server has it): `metrics_delta` holds the change,
per sample name with every label set summed, of each counter (a `counter` family's
`_total` sample) and each histogram or summary `_count` and `_sum`; never gauges or `_created`.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.live import client
from harness.live.http_target import Target, drive, run_closed, warm_up  # noqa: F401 - run_closed: the one driver
from harness.sweep.dispatch import OnDone
from harness.sweep.points import SweepError, Task, Timed, point

SETTLE_S = 0.05       # between the scrapes that must agree before a point's "after" is taken
SETTLE_TIMEOUT_S = 3.0


class Server:
    """The live target: its URL, its mode (from /health; "external" when it does not say) and model."""

    def __init__(self, url: str) -> None:
        try:
            self.target = Target(url)
            self.target.ping()
        except ValueError as exc:  # not an http URL, or nobody answers there
            raise SweepError(str(exc)) from None
        self.url = self.target.url
        health = self.target.get_json("/health") or {}
        self.reports_mode = bool(health.get("mode"))
        self.mode = str(health.get("mode") or "external")
        models = (self.target.get_json("/v1/models") or {}).get("data") or []
        self.model = models[0].get("id") if models else None  # no listed model: leave `model` out
        self.has_metrics = self.scrape() is not None

    def scrape(self) -> dict[str, float] | None:
        """The counted samples of /metrics (see the module doc), or None without a Prometheus /metrics."""
        try:
            status, body = client.request(self.url, "GET", "/metrics", timeout_s=10)
        except OSError:
            return None
        if status != 200:
            return None
        try:
            return counted_samples(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None

    def settled(self) -> dict[str, float] | None:
        """A scrape once two in a row agree: the last tick's counters land just after its tokens."""
        return client.settled(self.scrape, SETTLE_S, SETTLE_TIMEOUT_S)


def _sample(line: str) -> tuple[str, float]:
    """(name, value) of a Prometheus text sample line; labels are dropped (folded by the caller)."""
    if "{" in line:
        name, rest = line.split("{", 1)[0], line.rsplit("}", 1)[1]
    else:
        name, rest = line.split(None, 1)
    return name.strip(), float(rest.split()[0])


def counted_samples(text: str) -> dict[str, float]:
    """Counters and histogram/summary _count and _sum of a Prometheus text page, label sets summed."""
    types: dict[str, str] = {}
    samples: list[tuple[str, float]] = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                types[parts[2]] = parts[3]
        elif line.strip() and not line.startswith("#"):
            samples.append(_sample(line))
    counted = set()
    for family, kind in types.items():
        if kind == "counter":
            counted |= {family, family + "_total"}  # the TYPE line names it with or without _total
        elif kind in ("histogram", "summary"):
            counted |= {family + "_count", family + "_sum"}
    out: dict[str, float] = {}
    for name, value in samples:
        if name in counted and not name.endswith("_created"):
            out[name] = out.get(name, 0.0) + value
    return out


def delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float] | None:
    """after - before per name (a name new since `before` counts from 0; a drop is a restart: after)."""
    if before is None or after is None:
        return None
    return {name: round(value - before.get(name, 0.0) if value >= before.get(name, 0.0) else value, 6)
            for name, value in sorted(after.items())}


def run_live_point(server: Server, task: Task) -> dict:
    scen = task.scenario
    workload = scen.workload
    assert workload is not None
    specs = scen.specs(task.seed)
    before = server.settled() if server.has_metrics else None
    outs = drive(server.target, specs, workload, task.seed, server.model)
    after = server.settled() if server.has_metrics else None
    timed = [Timed(o.spec.id, o.sent_ms, o.token_times_ms, o.is_speculative, o.error) for o in outs]
    return point(task, timed, metrics_delta=delta(before, after))


def warm(server: Server, task: Task) -> None:
    """A few tokens of one classic and one speculative request, alone: cold paths stay out of point 1."""
    specs = task.scenario.specs(task.seed)
    picked = [next((s for s in specs if s.speculative is kind), None) for kind in (False, True)]
    warm_up(server.target, [s for s in picked if s is not None], task.seed, server.model)


def run_live(tasks: Sequence[Task], server: Server, on_done: OnDone | None = None) -> list[dict]:
    if tasks:
        warm(server, tasks[0])
    out = []
    for task in tasks:
        out.append(run_live_point(server, task))
        if on_done:
            on_done(out[-1])
    return out
