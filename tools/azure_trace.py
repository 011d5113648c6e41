"""A synthetic trace in the Azure LLM inference trace's CSV columns (TIMESTAMP,ContextTokens,GeneratedTokens).

Seeded and offline: arrivals are a gamma process (burstier than Poisson) whose rate swells
and ebbs over the span; lengths are lognormal, shaped like the public conversation trace
(context median ~1k tokens, output median ~130), clipped to fit a 4096-token KV slot.
    python tools/azure_trace.py --minutes 60 --out azure-1h.csv
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import math
from pathlib import Path

import numpy as np

START = dt.datetime(2023, 11, 16, 18, 0, 0)


def generate(minutes: float, rate_per_s: float, burstiness: float, seed: int) -> list[tuple[str, int, int]]:
    rng = np.random.default_rng(seed)
    span_s = minutes * 60.0
    # enough gaps for the busiest stretch; the rate at time t is rate x (1 + 0.5 sin(2 pi t / span))
    n = int(span_s * rate_per_s * 2) + 100
    unit = rng.gamma(burstiness, 1.0 / burstiness, n)   # mean 1: warped onto the varying rate below
    times, t = [], 0.0
    for gap in unit:
        t += gap / (rate_per_s * (1 + 0.5 * math.sin(2 * math.pi * t / span_s)))
        if t >= span_s:
            break
        times.append(t)
    count = len(times)
    context = np.clip(np.rint(rng.lognormal(math.log(1020), 0.8, count)), 4, 3000).astype(int)
    generated = np.clip(np.rint(rng.lognormal(math.log(130), 0.9, count)), 1, 1000).astype(int)
    return [((START + dt.timedelta(seconds=s)).isoformat(sep=" ", timespec="microseconds") + "0", int(c), int(g))
            for s, c, g in zip(times, context, generated)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=3.0, help="mean requests per second (default 3)")
    parser.add_argument("--burstiness", type=float, default=0.5, help="gamma shape of the gaps (default 0.5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = generate(args.minutes, args.rate, args.burstiness, args.seed)
    with args.out.open("w", newline="") as fp:
        writer = csv.writer(fp, lineterminator="\n")
        writer.writerow(("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
        writer.writerows(rows)
    print(f"{args.out}: {len(rows)} requests over {args.minutes:g} min")


if __name__ == "__main__":
    main()
