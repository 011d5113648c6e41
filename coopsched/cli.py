"""The `coopsched` command: run, sweep, serve, model build, calibrate, report, simulate, judge, compare.

Each subcommand lives in its own module exposing `add_arguments(parser)` and
`main(args) -> int`; modules are imported only when their command runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module, help)
COMMANDS = {
    "run": ("harness.run.cli", "run scenarios and check their bounds"),
    "sweep": ("harness.sweep.cli", "a workload at several loads x modes: per-token SLO attainment and capacity"),
    "serve": ("coopsched.server.cli", "OpenAI-compatible streaming server with /metrics"),
    "model": ("coopsched.backends.model_build", "build tiny seeded MLX models offline; export one as GGUF"),
    "calibrate": ("harness.calibrate.cli", "a mock cost profile of the MLX backend or any server (--target)"),
    "report": ("harness.report.build", "HTML/PNG report and benchmark trends"),
    "simulate": ("harness.sim.simulate", "seeded deterministic simulation with faults"),
    "judge": ("harness.judge.cli", "per-token SLO attainment of timings recorded by aiperf, locust or a trace"),
    "compare": ("harness.compare.cli", "two runs or two sweeps side by side: which metric regressed (a CI gate)"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="coopsched", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = next((a for a in argv if a in COMMANDS), None)
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text)
        if name == wanted:  # import only the command being run
            importlib.import_module(module).add_arguments(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    try:
        return int(module.main(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
