"""`coopsched calibrate`: a mock cost profile (a digital twin) of the MLX backend, or of any
OpenAI-compatible streaming server (`--target URL`), and with `--report` how well it predicts.

MLX: the engine's own ticks (harness/calibrate/ticks.py), then a concurrency2-like check. --target:
token timings alone (harness/calibrate/target.py). --report: a small fixed workload in every mode
the server supports (MLX: all; a server: the mode it runs), predicted on the profile in virtual
time and measured for real, interleaved with the calibration so both see the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from coopsched.core import MODES
from coopsched.twins import KINDS, UNKNOWN
from harness.calibrate import heldout, search
from harness.run.slo import parse_slo

MLX_REPEATS, TARGET_REPEATS, REPORT_RUNS = 5, 3, 5
BOOK_KINDS = ("llama.cpp", "coopsched", "vllm")  # servers whose /metrics keep step books (harness/calibrate/books.py)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, metavar="PROFILE.json", help="cost profile to write")
    parser.add_argument("--target", metavar="URL", help="calibrate this OpenAI-compatible server over HTTP")
    parser.add_argument("--model", type=Path, metavar="DIR", help="MLX target (default: tiny, built once)")
    parser.add_argument("--draft-model", type=Path, metavar="DIR", help="MLX drafter (default: tiny, built once)")
    parser.add_argument("--size", choices=("s", "m", "l"), default="s",
                        help="size of the tiny models built when no --model is given (default s)")
    parser.add_argument("--block-size", type=int, metavar="K",
                        help="K of the rounds (default: what the server's /health says, else 4)")
    parser.add_argument("--max-batch", type=int, default=8, metavar="N",
                        help="--target: the largest concurrent classic batch measured, of 1, 2, 4, 8 (default 8)")
    parser.add_argument("--repeats", type=int, metavar="N",
                        help=f"calibration passes, each over every point (default {MLX_REPEATS} for MLX, "
                             f"{TARGET_REPEATS} for --target)")
    parser.add_argument("--report", type=Path, metavar="PATH.json",
                        help="predicted vs measured on a small fixed workload, per mode, written here")
    parser.add_argument("--profile", type=Path, metavar="PROFILE.json",
                        help="with --report: check this profile instead of calibrating one")
    parser.add_argument("--report-runs", type=int, default=REPORT_RUNS, metavar="N",
                        help=f"real runs of the workload per mode, pooled (default {REPORT_RUNS})")
    parser.add_argument("--heldout-requests", type=int, default=heldout.NUM_REQUESTS, metavar="N",
                        help=f"--target --report: requests of each held-out workload run (default "
                             f"{heldout.NUM_REQUESTS})")
    parser.add_argument("--slo", default=heldout.CAPACITY_SLO, metavar="itl_ms=X,ttft_ms=Y",
                        help="--target --report: the SLO of the held-out capacity, live and on the twin "
                             f"(default {heldout.CAPACITY_SLO})")
    parser.add_argument("--capacity-rungs", type=int, default=search.RUNGS, metavar="N",
                        help="--target --report: rates the capacity search tries past the knee ladder, at most, "
                             f"each one live run of up to {search.MAX_RUNG_REQUESTS} requests arriving over "
                             f"{search.QUEUE_SPAN:g} x the SLO's TTFT (default {search.RUNGS}; 0: the capacity on "
                             "the ladder's rates only)")
    parser.add_argument("--server", choices=(*KINDS, UNKNOWN), metavar="KIND",
                        help="--target: the server's kind, whose scheduler the twin runs (default: detected from "
                             f"its /health, /props, /v1/models and /metrics): {', '.join((*KINDS, UNKNOWN))}")
    parser.add_argument("--twin-mode", choices=MODES,
                        help="--target --report: the mode to simulate (default: the server's /health mode, else slice)")
    parser.add_argument("--no-extensions", action="store_true",
                        help="--target: send plain OpenAI requests (no speculative / return_token_ids / ignore_eos)")
    parser.add_argument("--fused-layout", choices=("split", "padded"), default="split",
                        help="MLX: how the backend's fused tick runs (default split)")
    parser.add_argument("--check-runs", type=int, default=3,
                        help="MLX: real-time concurrency2 runs pooled for the comparison (default 3)")
    parser.add_argument("--no-check", action="store_true",
                        help="MLX: skip the concurrency2 comparison of the calibrated mock with MLX")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    bad = [f"--{name.replace('_', '-')} {value} (want >= {low})" for name, value, low in (
        ("block_size", args.block_size, 2), ("repeats", args.repeats, 1), ("report_runs", args.report_runs, 1),
        ("check_runs", args.check_runs, 1), ("max_batch", args.max_batch, 1),
        ("heldout_requests", args.heldout_requests, 2), ("capacity_rungs", args.capacity_rungs, 0))
        if value is not None and value < low]
    if bad:
        console.print(f"[red]error:[/] {', '.join(bad)}")
        return 2
    if (args.out is None) == (args.profile is None) or (args.profile and not args.report):
        console.print("[red]error:[/] give --out PROFILE.json (calibrate), or --profile PROFILE.json with "
                      "--report PATH.json (check an existing profile)")
        return 2
    if args.target and (args.model or args.draft_model):
        console.print("[red]error:[/] --target calibrates a server over HTTP; --model / --draft-model are for MLX")
        return 2
    try:
        parse_slo(args.slo)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc} (calibrate --slo: the held-out capacity's SLO)")
        return 2
    if args.server and not args.target:
        console.print(f"[red]error:[/] --server {args.server} names the kind of a --target server; the MLX "
                      "calibration times coopsched's own engine")
        return 2
    if not args.target and (args.model is None) != (args.draft_model is None):
        console.print("[red]error:[/] give --model and --draft-model together (the draft cost is part "
                      "of the profile), or neither to use the tiny models")
        return 2
    try:
        return _target(args, console) if args.target else _mlx(args, console)
    except (OSError, RuntimeError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}", soft_wrap=True)
        return 2


def _progress(console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=False)


# -- MLX -------------------------------------------------------------------------------------
def _mlx(args: argparse.Namespace, console) -> int:
    from coopsched.backends import calibrate as probes
    from coopsched.backends.mlx_backend import MlxBackend
    from coopsched.backends.model_build import ensure_tiny_models
    from mocks import CostModel

    k = args.block_size or 4
    checking = not (args.no_check or args.profile)
    with _progress(console) as progress:
        repeats, runs = (0 if args.profile else args.repeats or MLX_REPEATS), (args.report_runs if args.report else 0)
        task = progress.add_task("loading models", total=1 + max(repeats, runs) + checking)
        advance = lambda label: progress.update(task, advance=1, description=label)
        model_dir, draft_dir = args.model, args.draft_model
        if model_dir is None:
            model_dir, draft_dir = ensure_tiny_models(size=args.size,
                                                      progress=lambda m: progress.update(task, description=m))
        try:
            backend = MlxBackend(model_dir, draft_dir, fused_layout=args.fused_layout)
        except FileNotFoundError as exc:
            console.print(f"[red]error:[/] {exc}")
            return 2
        calibration, measured, loads = _mlx_passes(backend, k, repeats, runs, advance)
        check = None
        if args.profile:
            cost = CostModel.load(args.profile)
        else:
            profile = _draft_for(calibration.profile(fused_padding=args.fused_layout), backend, k)
            fitted = profile.pop("fit")
            cost = CostModel(**profile)
            if checking:
                progress.update(task, description="concurrency2: MLX vs calibrated mock")
                check = probes.calibration_error(profile, backend, args.check_runs, k)
                advance("done")
    if not args.profile:
        document = {**profile, "calibrated": {"backend": "mlx", "model": str(Path(model_dir).resolve()),
                                              "draft_model": str(Path(draft_dir).resolve()), "block_size": k,
                                              "passes": repeats, "fused_layout": args.fused_layout,
                                              "load_average": loads, "fit": fitted}}
        _write(args.out, {**document, **({"check_concurrency2": check} if check else {})})
        _print_profile(args.out, profile, fitted)
        if check:
            _print_check(check)
    if args.report:
        _mlx_report(args, cost, measured, runs, k, loads)
    return 0


def _mlx_passes(backend, k: int, repeats: int, runs: int, advance):
    """A dropped warm-up pass, then calibration passes and checked workload runs (every mode)
    interleaved, so both see the same machine. (calibration, {mode: runs}, load averages)."""
    from harness.calibrate import twin
    from harness.calibrate.ticks import TickCalibration

    fresh = lambda _clock=None: backend.fresh()
    TickCalibration(fresh, k).run_pass()  # first calls, allocations
    calibration = TickCalibration(fresh, k)
    measured: dict[str, list] = {mode: [] for mode in MODES}
    loads: list[float] = []
    advance("calibrating" if repeats else "measuring")
    for i in range(max(repeats, runs)):
        if i < repeats:
            calibration.run_pass()
        if i < runs:
            for mode in MODES:
                measured[mode].append(twin.measure_in_process(backend.fresh, twin.twin_config(mode, k), i))
        loads.append(os.getloadavg()[0])
        advance(f"pass {i + 1}/{max(repeats, runs)} (load {loads[-1]:.1f})")
    return calibration, measured, loads


def _mlx_report(args: argparse.Namespace, cost, measured: dict, runs: int, k: int, loads: list[float]) -> None:
    from harness.calibrate import twin

    predict = {mode: twin.simulate(cost, twin.twin_config(mode, k), range(runs)) for mode in MODES}
    report = twin.build_report(measured, predict, runs, {
        "backend": "mlx", "fused_layout": args.fused_layout, "profile": str(args.profile or args.out),
        "load_average": loads})
    _write(args.report, report)
    _print_report(report, f"the twin vs MLX ({runs} runs per mode, load average {min(loads):.1f}-{max(loads):.1f})")


def _print_report(report: dict, title: str) -> None:
    from rich.console import Console

    from harness.calibrate import twin

    twin.print_report(Console(), report, title)


def _draft_for(profile: dict, backend, k: int) -> dict:
    """A padded fused forward is priced with the drafter's own cost: probe it (a split one needs none)."""
    if profile["fused_padding"] != "padded" or profile["draft_per_token_ms"] > 0:
        return profile
    from coopsched.backends import calibrate as probes

    probe = probes._Probe(backend)
    try:
        sample = probe.draft(probe.start(1, True, offset=50)[0], k - 1)
        per_token = sorted(sample()[0] for _ in range(9))[4]  # the median of 9 calls
    finally:
        probe.close()
    return {**profile, "draft_per_token_ms": round(per_token, 4)}


# -- a server over HTTP ----------------------------------------------------------------------------
def _target(args: argparse.Namespace, console) -> int:
    from harness.calibrate import target, twin
    from harness.run.runner import Profile
    from mocks import CostModel

    server = target.Server.connect(args.target, extensions=not args.no_extensions)
    if not server.health and not server.model:
        raise RuntimeError(f"{server.url} answers neither /health nor /v1/models: is it an OpenAI-compatible server?")
    console.print(f"{server.url}: context {server.context_source}; mode "
                  f"{server.mode or 'not reported (no /health mode)'}", highlight=False, soft_wrap=True)
    checked = _profile_document(args.profile) if args.profile else {}  # --profile: read once
    kind, evidence = _server_kind(args, checked.get("server"), server.url, console)
    calibration = target.TargetCalibration(server, args.block_size, args.max_batch)
    repeats = 0 if args.profile else args.repeats or TARGET_REPEATS
    runs = args.report_runs if args.report else 0
    loads: list[float] = []
    with _progress(console) as progress:
        task = progress.add_task(f"calibrating {server.url}", total=repeats * len(calibration.PHASES) + runs)
        if repeats:
            calibration.run(repeats, lambda label: progress.update(task, advance=1, description=label))
            profile = calibration.profile()
            speculates = profile["fit"]["speculates"]
        else:
            calibration.warm_up()
            # a --target profile says whether the server speculated when it was calibrated (default: yes)
            speculates = checked.get("calibrated", {}).get("fit", {}).get("speculates", True) is not False
        workload = twin.TWIN if speculates else twin.classic(twin.TWIN)
        loads.append(os.getloadavg()[0])
        measured: list = []
        for i in range(runs):
            measured.append(target.measure_workload(server, workload.requests, i))
            loads.append(os.getloadavg()[0])
            progress.update(task, advance=1, description=f"workload run {i + 1}/{runs}")
    k = calibration.block_size
    if args.profile:
        loaded = Profile.load(args.profile)
        the_twin = Profile(loaded.cost, kind, loaded.server_params if kind == loaded.server else {})
        replaced = checked.get("calibrated", {}).get("replaced") or {}
    else:
        fitted = profile.pop("fit")
        params, server_fit, replaced = _fit_server(kind, server, profile, fitted, console)
        the_twin = Profile(CostModel(**profile), kind, params)
        document = {**profile, "server": kind, "server_params": params,
                    "calibrated": {"target": server.url, "model": server.model, "mode": server.mode,
                                   "block_size": k, "repeats": repeats, "extensions": server.extensions,
                                   "context": server.context_source, "load_average": loads,
                                   "server_evidence": evidence, "server_fit": server_fit, "replaced": replaced,
                                   "fit": fitted}}
        _write(args.out, document)
        _print_target_fit(args.out, {**profile, **replaced}, fitted, k)  # the terms as the timing fit found them
        if replaced:
            console.print(f"the {kind} twin prices {', '.join(sorted(replaced))} from the server's own counts "
                          f"(the {kind}: lines above); server_params {params}", highlight=False, soft_wrap=True)
    if args.report:
        config = target.twin_config_of(server, args.twin_mode, k)
        predict = {config.mode: twin.simulate(the_twin, config, range(max(runs, 5)), workload)}
        meta = report_meta(server.url, args.profile or args.out, loads, speculates, kind, evidence)
        report = twin.build_report({config.mode: measured}, predict, runs, meta)
        served = "" if speculates else ", every request classic: the server never speculated"
        _print_report(report, f"the twin vs {server.url} (mode {config.mode}, {runs} runs{served})")
        # beside: today's cost-only twin, or coopsched's own scheduler at the timing fit's prices
        before = (Profile(CostModel(**{**the_twin.cost.to_json(), **replaced}))
                  if kind != UNKNOWN and (kind != "coopsched" or replaced) else None)
        report["heldout"] = _heldout(args, server, the_twin, before, config, console, kind)
        report["load_average"] = [*loads, os.getloadavg()[0]]
        _write(args.report, report)
        _print_heldout(report["heldout"], server.url, kind)
    return 0


def _fit_server(kind: str, server, profile: dict, fitted: dict, console) -> tuple[dict, dict, dict]:
    """The kind's scheduler parameters the server does not report, probed live (printed as measured);
    cost terms the kind's model prices its own way replace the timing fit's, which are kept in
    `replaced`. Returns (server_params, the probes' evidence, the replaced terms)."""
    from harness.calibrate import server_params
    from mocks import CostModel

    said: list[str] = []

    def say(line: str) -> None:
        said.append(line)
        console.print(line, highlight=False, soft_wrap=True)

    params, evidence, costs = server_params.fit_params(kind, server, profile, fitted, say)
    for line in [] if said else evidence.get("says", []):  # a fitter that reports its lines at the end
        console.print(line, highlight=False, soft_wrap=True)
    defaults = CostModel().to_json()  # a term the timing fit has not set is replaced from its default
    replaced = {name: profile.get(name, defaults.get(name)) for name in costs}
    profile.update(costs)
    return params, evidence, replaced


def _server_kind(args: argparse.Namespace, kept: object, url: str, console) -> tuple[str, str]:
    """The kind whose scheduler the twin runs: --server, else the checked --profile's own, else
    detected from what the server exposes."""
    from harness.calibrate.detect import detect_kind

    detected, evidence = detect_kind(url)
    kept = kept if isinstance(kept, str) else None
    if args.server or kept:
        source = f"--server {args.server}" if args.server else f"the profile's server {kept}"
        evidence = f"{source} (detected {detected}: {evidence})"
    kind = args.server or kept or detected
    console.print(f"server kind {kind}: {evidence}", highlight=False, soft_wrap=True)
    if kind == UNKNOWN:
        console.print("[yellow]note:[/] the server's kind is unknown: its twin runs coopsched's own scheduler at "
                      "the calibrated costs (--server KIND names the kind)", highlight=False, soft_wrap=True)
    return kind, evidence


def _profile_document(path: Path) -> dict:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--profile {path}: {exc}") from None
    if not isinstance(document, dict):
        raise ValueError(f"--profile {path}: want a JSON object (a profile calibrate wrote)")
    return document


def report_meta(url: str, profile: Path, loads: list[float], speculates: bool, kind: str, evidence: str) -> dict:
    """The report's keys beside its figures: what was checked, against what, on which machine."""
    return {"target": url, "profile": str(profile), "load_average": loads, "speculates": speculates,
            "server": kind, "server_evidence": evidence}


def _heldout(args: argparse.Namespace, server, the_twin, before, config, console, kind: str) -> dict:
    """The held-out workloads live (fresh prompts every run: a prefix cache must not answer them)
    and on the twin (and `before`, the cost-only twin, beside it), behind a progress bar; for a
    server that keeps step books (llama-server, coopsched, vLLM) each run's from /metrics beside the twins'."""
    import itertools
    import secrets

    from harness.calibrate import books, target, twin
    from harness.live import client

    # fresh prompts every run, and every calibration: a prefix cache warm from an earlier one answers none
    prompt_seeds = itertools.count(heldout.SEED * 1000 + secrets.randbelow(10**9))
    kept: dict[str, dict | None] = {}  # each side's books of the run it made last
    keeps_books = kind in BOOK_KINDS
    scrape = lambda: client.settled(lambda: client.try_scrape(server.url)) if keeps_books else None

    def live(scen, _run, give_up):
        scraped = scrape()
        rows = target.measure_workload(server, scen.specs(heldout.SEED), next(prompt_seeds), give_up)
        kept["live"] = books.server_books(scraped, scrape())
        return twin.timed_of(scen.specs(heldout.SEED), rows)

    def on(side, profile):
        keep = lambda run: kept.__setitem__(side, books.twin_books(run, kind))
        return lambda scen, draw: twin.simulate_timed(profile, config, scen, heldout.SEED, on_run=keep, draw=draw)

    with _progress(console) as progress:
        task = progress.add_task("held-out workloads", total=None)
        return heldout.check(live, on("twin", the_twin), heldout.solo_life_ms(the_twin.cost), args.heldout_requests,
                             progress=lambda label: progress.update(task, description=label),
                             before=on("before", before) if before else None, slo=parse_slo(args.slo),
                             books=(lambda side: kept.pop(side, None)) if keeps_books else None,
                             capacity_rungs=args.capacity_rungs,
                             log=lambda line: progress.console.print(line, highlight=False, soft_wrap=True))


def _print_heldout(report: dict, url: str, kind: str) -> None:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # a log or a pipe: the table's full width, not 80 columns
        console = Console(width=max(console.width, 132))
    heldout.print_check(console, report, f"held-out workloads: the {kind} twin vs {url} ({report['live_runs']} "
                                           f"live runs, {report['requests']} requests each, half speculative)")


# -- output ---------------------------------------------------------------------------------------
def _write(path: Path, document: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")


def _ms(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def _print_profile(path: Path, profile: dict, fitted: dict) -> None:
    from rich.console import Console

    out = Console()
    out.print(f"wrote {path}: decode {profile['decode_ms']}, round {profile['round_ms']}, prefill "
              f"{profile['prefill_fixed_ms']} + {profile['prefill_per_token_ms']}/token ms (+ "
              f"{profile['draft_prefill_per_token_ms']}/token with the drafter), switch {profile['switch_ms']} ms "
              f"(measured {fitted.get('switch_ms_measured')} +/- {fitted.get('switch_ms_se')}), accept_prob "
              f"{profile['accept_prob']}, fused steps {fitted.get('fused_step_ms')}", highlight=False)
    residuals = fitted.get("prefill_residuals_ms") or []
    if residuals:
        out.print(f"prefill fit residuals (ms): mean |r| {sum(map(abs, residuals)) / len(residuals):.3f}, "
                  f"max |r| {max(map(abs, residuals)):.3f} over {len(residuals)} admissions", highlight=False)


def _print_target_fit(path: Path, profile: dict, fitted: dict, k: int) -> None:
    from rich.console import Console
    from rich.table import Table

    out = Console()
    table = Table(title=f"calibrated from token timings -> {path}", box=None, pad_edge=False, padding=(0, 1),
                  header_style="bold")
    for col in ("term", "x", "measured ms", "fitted ms", "residual"):
        table.add_column(col, justify="left" if col == "term" else "right", no_wrap=True)
    for name in ("prefill", "slice0") if fitted["speculates"] else ("prefill",):
        for x, y, r in sorted(fitted[name]["points"]):
            table.add_row(f"{name} TTFT", f"{x:g} tok", _ms(y), _ms(y - r), f"{r:+.2f}")
    decode = dict(profile["decode_ms"])
    for b, s in fitted["decode"].items():
        table.add_row("decode", f"B={b}", f"{_ms(s['mean'])} (p50 {_ms(s['p50'])}, p99 {_ms(s['p99'])})",
                      _ms(decode[int(b)]), f"{decode[int(b)] - s['mean']:+.2f}")
    if fitted["speculates"]:
        _print_rounds(out, table, profile, fitted, k)
        return
    out.print(table)
    out.print(f"[yellow]not fitted:[/] {', '.join(fitted['unfitted'])}: {next(iter(fitted['unfitted'].values()))}; "
              "the profile prices no speculation (round_ms null, accept_prob null)", highlight=False, soft_wrap=True)


def _print_rounds(out, table, profile: dict, fitted: dict, k: int) -> None:
    rounds = fitted["rounds"]
    table.add_row("round", f"K={k}", f"{_ms(rounds['mean'])} (p50 {_ms(rounds['p50'])}, p99 {_ms(rounds['p99'])})",
                  _ms(profile["round_ms"][0][1]), "")
    mix = fitted["mix"]
    table.add_row("classic beside spec", "", f"{_ms(mix['mean'])} (p50 {_ms(mix['p50'])}, p99 {_ms(mix['p99'])})",
                  "", "")
    out.print(table)
    drafts = fitted.get("server_drafts")
    counted = "" if not drafts else (f"; the server counted {drafts['accepted_tokens']} of {drafts['draft_tokens']} "
                                     f"draft tokens accepted ({drafts['acceptance']}); round_ms and accept_prob "
                                     f"from {rounds['from']} (timing alone: {_ms(rounds['timed_round_ms'])} ms, "
                                     f"accept_prob {rounds['timed_accept_prob']})")
    out.print(f"rounds: {rounds['num_rounds']} timed, {rounds['tokens_per_round']:.3f} tokens per round -> accept_prob "
              f"{profile['accept_prob']}{counted}; draft/token {profile['draft_per_token_ms']} ms; "
              f"switch {profile['switch_ms']} ms (measured {_ms(fitted['switch_ms_measured'])}); "
              f"classic streams that arrived in rounds: "
              f"{fitted['classic_streams_in_rounds']}; speculative asks served classically: "
              f"{fitted['speculative_served_classically']}", highlight=False)
    if fitted["classic_streams_in_rounds"]:
        out.print("[yellow]warning:[/] classic requests arrived in rounds: the server ignores `speculative: false`, "
                  "so the decode steps above are mixed with rounds")


def _print_check(check: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from coopsched.backends.calibrate import METRICS

    table = Table(title=f"concurrency2: calibrated mock vs MLX ({check['runs']} runs, "
                        f"acceptance {check['acceptance']})")
    for col in ("metric", "mlx mean", "mock mean", "error", "mlx p99", "mock p99", "error"):
        table.add_column(col, justify="left" if col == "metric" else "right", no_wrap=True)
    pct = lambda x: "-" if x is None else f"{x:+.0%}"
    for metric in METRICS:
        m = check[metric]
        table.add_row(metric, _ms(m["mlx"]["mean"]), _ms(m["mock"]["mean"]), pct(m["error"]["mean"]),
                      _ms(m["mlx"]["p99"]), _ms(m["mock"]["p99"]), pct(m["error"]["p99"]))
    Console().print(table)
