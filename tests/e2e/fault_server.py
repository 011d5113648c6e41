"""`coopsched serve` with injected faults or planted bugs, for the e2e fault tests.

    python tests/e2e/fault_server.py [--poison MARKER [--poison-after N]] [--plant NAME] [serve args...]

--poison: a request whose prompt contains MARKER has its (N+1)-th decode / verify / fused
call fail (a BackendError naming it), so it streams a few tokens and then fails.
--plant removes one piece of handling, so a test can show it fails without it:
  no-containment  a failed model call takes the engine down instead of its request
  no-cancel       a client that disconnects does not cancel its request
  plain-shutdown  SIGTERM drains open streams instead of ending them with an error event
"""

from __future__ import annotations

import argparse
import sys

from coopsched import cli
from coopsched.core.scheduler import Scheduler
from coopsched.executor import BackendError
from coopsched.server import cli as server_cli
from coopsched.server.runtime import EngineHost
from harness.sim.faults import FaultyBackend

PLANTS = ("no-containment", "no-cancel", "plain-shutdown")


def plant(name: str) -> None:
    if name == "no-containment":
        def reraise(self, plan, result, releases):
            raise BackendError(result.error or "", result.failed)
        Scheduler._fail = reraise
    elif name == "no-cancel":
        EngineHost.cancel = lambda self, seq_id: None
    elif name == "plain-shutdown":
        server_cli._graceful_server = lambda uvicorn, config, host: uvicorn.Server(config)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--poison")
    parser.add_argument("--poison-after", type=int, default=3)
    parser.add_argument("--plant", choices=PLANTS)
    ours, rest = parser.parse_known_args(argv)
    if ours.plant:
        plant(ours.plant)
    build_host = server_cli.build_host

    def with_faults(args):
        host = build_host(args)
        if ours.poison:
            executor = host.engine.executor
            executor.backend = faulty = FaultyBackend(executor.backend)
            faulty.arm_on_prompt(ours.poison, "raise", ("decode", "verify", "fused"), skip=ours.poison_after)
        return host

    server_cli.build_host = with_faults
    return cli.main(["serve", *rest])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
