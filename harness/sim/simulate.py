"""`coopsched simulate`: seeded deterministic simulation with faults, in virtual time.

Each seed builds a random scheduler config (every mode, chunked and batched prefill
drawn from a generator of their own, so the other draws stay as they were) and a small
workload: bursty arrivals, mixed lengths, priorities, stop strings, min_tokens and
ignore_eos (also from their own generator), plus the faults asked for (cancels,
disconnects inside a model call and between draft and verify, KV exhaustion and
oversized requests, a drafter outage, a backend that fails one request). Every tick
is checked (harness.sim.invariants); a failing seed prints a one-line replay command.
Same seed, same run: nothing reads a clock or an unseeded random source.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

from coopsched.clock import ManualClock
from coopsched.core import MODES, Priority, Request, RequestError, SamplingParams, Scheduler, SchedulerConfig
from harness.sim.faults import ANY, Fault, FaultyBackend
from harness.sim.invariants import Checked, InvariantError

FAULT_NAMES = ("cancel", "disconnect", "disconnect-verify", "kv", "drafter", "backend")
FAULT_HELP = {
    "cancel": "clients cancel between ticks",
    "disconnect": "clients vanish inside a prefill, decode or draft call (mid-round)",
    "disconnect-verify": "clients vanish between draft and verify",
    "kv": "few KV slots under bursts, and requests too long for a slot (refused at submit)",
    "drafter": "the drafter raises for a while (every speculative row it drafts fails)",
    "backend": "the backend raises for one request (named, or a plain exception for its whole call)",
}
CHUNK = 50


@dataclass
class Outcome:
    seeds: int = 0
    counts: Counter = field(default_factory=Counter)
    failures: list[tuple[int, str]] = field(default_factory=list)

    def merge(self, other: Outcome) -> None:
        self.seeds += other.seeds
        self.counts.update(other.counts)
        self.failures += other.failures


def parse_faults(text: str) -> tuple[str, ...]:
    if text in ("all", ""):
        return FAULT_NAMES
    if text == "none":
        return ()
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in FAULT_NAMES]
    if unknown:
        raise ValueError(f"--faults: unknown fault(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(FAULT_NAMES)}, 'all' or 'none'")
    return names


def replay_command(seed: int, faults: tuple[str, ...]) -> str:
    mix = "all" if faults == FAULT_NAMES else (",".join(faults) or "none")
    return f"coopsched simulate --seeds 1 --start {seed} --faults {mix}"


# -- one seed ------------------------------------------------------------------
def prefill_knobs(seed: int) -> dict:
    """Chunked and batched prefill for a seed (half the seeds keep the defaults): prompts here
    are 1-12 tokens, so chunks of 1-8 split most of them."""
    rng = random.Random(f"prefill:{seed}")
    if rng.random() < 0.5:
        return {}
    return {"prefill_chunk_tokens": rng.choice((0, 1, 2, 3, 5, 8)), "max_batch_prefill": rng.randint(1, 4),
            "prefill_grant_interval": rng.choice((16, 0, 1, 2)), "mixed_step": rng.random() < 0.3}


def eos_rules(rng: random.Random, max_tokens: int) -> dict:
    """min_tokens and ignore_eos for one request: most keep the defaults; min_tokens spans 1..max_tokens."""
    roll = rng.random()
    return {"min_tokens": rng.randint(1, max_tokens) if roll < 0.3 else 0, "ignore_eos": 0.3 <= roll < 0.4}


def build(seed: int, faults: tuple[str, ...], knobs: bool = True):
    """The checked scheduler and the seed's timeline: (time_ms, kind, payload), sorted.
    `knobs=False` keeps prefill, min_tokens and ignore_eos at their defaults (the runs stored
    before those were drawn)."""
    from mocks import CostModel, MockBackend, MockDrafter, MockTarget

    rng = random.Random(seed)
    tight = "kv" in faults and rng.random() < 0.6
    config = SchedulerConfig(
        mode=rng.choice(MODES), max_batch_size=rng.randint(1, 4),
        num_kv_slots=rng.randint(1, 3) if tight else rng.randint(2, 8),
        slot_tokens=rng.randint(12, 26) if "kv" in faults else 64, block_size=rng.randint(2, 5),
        grant_rounds=rng.choice((0, 1, 2, 8)), backlog_cap=rng.randint(1, 3),
        enable_batch=rng.random() < 0.4, enable_ragged=rng.random() < 0.3,
        **(prefill_knobs(seed) if knobs else {}))
    clock = ManualClock()
    cost = CostModel.simple(rng.choice((2.0, 5.0)), rng.choice((10.0, 30.0)), 0.2, config.block_size)
    drafter = MockDrafter(rng.choice((0.0, 0.5, 0.8, 1.0)), seed=seed)
    mock = MockBackend(clock, cost, MockTarget(eos_rate=rng.choice((0.0, 0.0, 0.06))), drafter)
    faulty = FaultyBackend(mock)
    checked = Checked(Scheduler(config), faulty, mock, clock)
    faulty.on_disconnect = checked.cancel

    timeline = []
    t = 0.0
    eos_rng = random.Random(f"eos:{seed}")  # its own stream: the rest of the seed's draws stay as they were
    for i in range(rng.randint(3, 12)):
        if rng.random() < 0.35:  # bursty: most requests land together, a few after a gap
            t += rng.choice((0.0, rng.uniform(1, 40), rng.uniform(40, 200)))
        prompt_len = rng.choice((1, rng.randint(2, 6), rng.randint(6, 12)))
        max_tokens = rng.choice((1, rng.randint(2, 8), rng.randint(8, 14)))
        seq_id = f"s{seed}-{i}"
        drafter.scripts[seq_id] = [rng.randint(0, 4) for _ in range(rng.randint(0, 3))]
        request = Request(seq_id, tuple(rng.randint(32, 126) for _ in range(prompt_len)), max_tokens,
                          SamplingParams(rng.choice((0.0, 0.0, 0.8)), seed=rng.randint(0, 9),
                                         **(eos_rules(eos_rng, max_tokens) if knobs else {})),
                          stop=rng.choice(((), (), (), ("a",), ("Q", "zz"))),
                          speculative=rng.random() < 0.7, priority=rng.choice(list(Priority)))
        timeline.append((t, 0, "submit", request))
        _plan_faults(rng, timeline, t, seq_id, faults)
    if "drafter" in faults and rng.random() < 0.3:
        start = rng.uniform(0, t + 50)
        timeline.append((start, 1, "drafter-down", None))
        timeline.append((start + rng.uniform(5, 100), 1, "drafter-up", None))
    timeline.sort(key=lambda e: (e[0], e[1]))
    return checked, timeline


def _plan_faults(rng: random.Random, timeline: list, t: float, seq_id: str, faults) -> None:
    roll = rng.random()
    if "cancel" in faults and roll < 0.12:
        timeline.append((t + rng.uniform(0, 80), 2, "cancel", seq_id))
    elif "disconnect" in faults and roll < 0.22:
        timeline.append((t, 1, "arm", Fault("disconnect", rng.choice(("prefill", "decode", "draft")), seq_id)))
    elif "disconnect-verify" in faults and roll < 0.32:
        timeline.append((t, 1, "arm", Fault("disconnect", "verify", seq_id)))
    elif "backend" in faults and roll < 0.40:
        call = rng.choice(("prefill", "decode", "draft", "verify", "fused"))
        timeline.append((t, 1, "arm", Fault(rng.choice(("raise", "generic")), call, seq_id,
                                            persistent=rng.random() < 0.5)))


def run_seed(seed: int, faults: tuple[str, ...], counts: Counter | None = None, knobs: bool = True) -> Counter:
    """Simulate one seed; raise InvariantError (or the scheduler's own exception) on a violation."""
    checked, timeline = build(seed, faults, knobs)
    sched, clock, faulty = checked.scheduler, checked.clock, checked.faulty
    outage = Fault("generic", "draft", ANY, persistent=True)
    counts = Counter() if counts is None else counts
    max_ticks = 400 + 60 * sum(1 for e in timeline if e[2] == "submit")
    while timeline or sched.has_work:
        while timeline and timeline[0][0] <= clock.now():
            _, _, kind, payload = timeline.pop(0)
            counts[f"event:{kind}"] += 1
            if kind == "submit":
                try:
                    checked.submit(payload)
                except RequestError:
                    if len(payload.prompt_token_ids) + payload.max_tokens <= sched.kv.slot_tokens:
                        raise
                    counts["refused:too-long"] += 1
            elif kind == "cancel":
                checked.cancel(payload)
            elif kind == "arm":
                faulty.arm(payload)
            elif kind == "drafter-down":
                faulty.arm(outage)
            elif kind == "drafter-up" and outage in faulty.faults:
                faulty.faults.remove(outage)
        if sched.is_idle:
            if not timeline:
                break
            clock.advance_to(timeline[0][0])
            continue
        checked.step()
        if checked.num_ticks > max_ticks:
            raise InvariantError(f"no progress after {checked.num_ticks} ticks: {checked.live_ids} live")
    if checked.live_ids:
        raise InvariantError(f"the run ended with {checked.live_ids} unfinished")
    checked.check_state("end of run")
    if sched.kv.num_in_use or checked.mock.num_live:
        raise InvariantError(f"end of run: {sched.kv.num_in_use} KV slots and "
                             f"{checked.mock.num_live} backend caches still held")
    summary = checked.summary()
    counts["ticks"] += summary["ticks"]
    counts["requests"] += summary["requests"]
    counts[f"mode:{sched.config.mode}"] += 1
    counts["kv_full_ticks"] += summary["kv_full_ticks"]
    counts["rotations"] += sum(1 for g in sched.obs.grant_log if g.startswith("park:"))
    counts["waiter_parks"] += sched.obs.waiter_parks
    for reason, n in summary["finished"].items():
        counts[f"finish:{reason}"] += n
    for request in checked.submitted.values():  # keys only where drawn: stored counts stay valid
        if request.sampling.min_tokens:
            counts["requests:min_tokens"] += 1
        if request.sampling.ignore_eos:
            counts["requests:ignore_eos"] += 1
    config = sched.config
    if config.is_chunked or config.max_batch_prefill > 1:  # keys only where used: stored counts stay valid
        counts["prefill:chunked-seeds"] += config.is_chunked
        counts["prefill:batched-seeds"] += config.max_batch_prefill > 1
        for kind in ("chunk", "admit-batch"):
            counts[f"prefill:{kind}-ticks"] += summary["kinds"].get(kind, 0)
    for fault, n in summary["faults"].items():
        counts[f"fired:{fault}"] += n
    return counts


def run_chunk(args: tuple) -> Outcome:
    """Seeds [start, stop) with `faults`; an optional fourth item False keeps prefill at its defaults."""
    start, stop, faults, *rest = args
    knobs = rest[0] if rest else True
    outcome = Outcome()
    for seed in range(start, stop):
        try:
            run_seed(seed, faults, outcome.counts, knobs)
        except Exception as exc:  # any exception is a finding: report the seed, keep going
            kind = "" if isinstance(exc, InvariantError) else f"{type(exc).__name__}: "
            where = traceback.extract_tb(exc.__traceback__)[-1]
            outcome.failures.append((seed, f"{kind}{exc} [{os.path.basename(where.filename)}:{where.lineno}]"))
        outcome.seeds += 1
    return outcome


def simulate(seeds: int, start: int = 0, faults: tuple[str, ...] = FAULT_NAMES, jobs: int = 1,
             on_progress=None) -> Outcome:
    chunks = [(s, min(s + CHUNK, start + seeds), faults) for s in range(start, start + seeds, CHUNK)]
    total = Outcome()
    if jobs <= 1 or len(chunks) == 1:
        results = map(run_chunk, chunks)
    else:
        pool = multiprocessing.get_context("fork").Pool(jobs)
        results = pool.imap_unordered(run_chunk, chunks)
    for outcome in results:
        total.merge(outcome)
        if on_progress:
            on_progress(outcome.seeds)
    if jobs > 1 and len(chunks) > 1:
        pool.close()
        pool.join()
    total.failures.sort()
    return total


# -- command line --------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seeds", type=int, default=1000, metavar="N", help="how many seeds (default 1000)")
    parser.add_argument("--start", type=int, default=0, metavar="S", help="first seed (default 0)")
    parser.add_argument("--faults", default="all", metavar="LIST",
                        help="comma list of " + "; ".join(f"{k}: {v}" for k, v in FAULT_HELP.items())
                        + " (default all; 'none' for clean runs)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), metavar="J",
                        help="worker processes (default: up to 2)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=False)
    try:
        faults = parse_faults(args.faults)
        if args.seeds < 1:
            raise ValueError(f"--seeds {args.seeds}: want at least 1")
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    began = time.perf_counter()
    with Progress(TextColumn("simulate"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=args.no_progress or not console.is_terminal, transient=True) as bar:
        task = bar.add_task("seeds", total=args.seeds)
        outcome = simulate(args.seeds, args.start, faults, max(1, args.jobs),
                           on_progress=lambda n: bar.advance(task, n))
    elapsed = time.perf_counter() - began
    print_summary(console, outcome, faults, elapsed, args)
    for seed, message in outcome.failures[:20]:
        console.print(f"[red]FAIL seed {seed}:[/] {message}", highlight=False, soft_wrap=True)
        console.print(f"  replay: {replay_command(seed, faults)}", highlight=False, soft_wrap=True)
    if outcome.failures:
        console.print(f"[red]{len(outcome.failures)} of {outcome.seeds} seeds failed[/]")
        return 1
    return 0


def print_summary(console, outcome: Outcome, faults, elapsed: float, args) -> None:
    from rich.table import Table

    c = outcome.counts
    table = Table(title=f"coopsched simulate: seeds {args.start}..{args.start + outcome.seeds - 1}",
                  caption=f"faults: {', '.join(faults) or 'none'}")
    table.add_column("what")
    table.add_column("count", justify="right")
    rows = [("seeds", outcome.seeds), ("seeds/s", f"{outcome.seeds / max(elapsed, 1e-9):.0f}"),
            ("wall s", f"{elapsed:.1f}"), ("ticks", c["ticks"]), ("requests", c["requests"]),
            ("requests with min_tokens / ignore_eos", f"{c['requests:min_tokens']} / {c['requests:ignore_eos']}")]
    rows += [(k, v) for k, v in sorted(c.items()) if k.split(":")[0] in ("mode", "finish")]
    rows += [("KV-full ticks (admission waited)", c["kv_full_ticks"]),
             ("refused: too long for a slot", c["refused:too-long"]),
             ("rotations / waiter parks", f"{c['rotations']} / {c['waiter_parks']}"),
             ("cancel events (between ticks)", c["event:cancel"]), ("drafter outages", c["event:drafter-down"]),
             ("seeds with chunked / batched prefill", f"{c['prefill:chunked-seeds']} / {c['prefill:batched-seeds']}"),
             ("chunk ticks / batched admissions", f"{c['prefill:chunk-ticks']} / {c['prefill:admit-batch-ticks']}")]
    rows += [(k.replace("fired:", "fault fired: "), v) for k, v in sorted(c.items()) if k.startswith("fired:")]
    for name, value in rows:
        table.add_row(name, str(value))
    console.print(table)
    status = "[green]all seeds passed[/]" if not outcome.failures else "[red]failures below[/]"
    console.print(f"{outcome.seeds} seeds in {elapsed:.1f} s ({outcome.seeds / max(elapsed, 1e-9):.0f} seeds/s): "
                  f"{status}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="coopsched simulate")
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
