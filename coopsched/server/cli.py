"""`coopsched serve`: the OpenAI-compatible streaming server (FastAPI + uvicorn) on one engine thread.

The mock pays its cost by sleeping precisely (RealClock); the MLXCEL_* gates
decide the scheduler mode as the README's "Environment gates" says (`--mode` wins over them).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from pathlib import Path

from coopsched.core.config import MODES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=("mock", "mlx"), default="mock")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    parser.add_argument("--model", type=Path, metavar="DIR",
                        help="MLX target model directory (default: the tiny seeded pair, built once)")
    parser.add_argument("--draft-model", type=Path, metavar="DIR",
                        help="MLX draft model directory (none: every request is served classically)")
    parser.add_argument("--decode-ms", type=float, default=5.0, help="mock: one decode step (default 5)")
    parser.add_argument("--round-ms", type=float, default=30.0,
                        help="mock: one speculative round of K (default 30)")
    parser.add_argument("--prefill-ms-per-token", type=float, default=0.2,
                        help="mock: prefill cost per prompt token (default 0.2)")
    parser.add_argument("--cost", type=Path, metavar="PROFILE.json",
                        help="mock: a cost profile (coopsched calibrate); wins over the three knobs above")
    parser.add_argument("--accept-prob", type=float, default=None,
                        help="mock: the drafter's per-token acceptance probability (default: the --cost "
                             "profile's accept_prob if it has one, else 0.7)")
    parser.add_argument("--eos-rate", type=float, default=0.0,
                        help="mock: share of positions where the target samples EOS (default 0: outputs run "
                             "to max_tokens; > 0 gives min_tokens and ignore_eos something to do)")
    parser.add_argument("--max-context", type=int, default=4096,
                        help="tokens a KV slot holds: prompt + max_tokens must fit (default 4096)")
    parser.add_argument("--max-queue", type=int, default=256,
                        help="requests that may wait for their first token before 429 (default 256)")
    parser.add_argument("--max-batch-size", type=int, default=8, help="classic decode rows (default 8)")
    parser.add_argument("--num-slots", type=int, default=32, help="KV slots (default 32)")
    parser.add_argument("--prefill-chunk-tokens", type=int, metavar="N",
                        help="prefill at most N prompt tokens per tick, so decode rows step between the chunks "
                             "of a long prompt; 0: whole prompts (default: MLXCEL_PREFILL_CHUNK, else 0)")
    parser.add_argument("--prefill-grant-interval", type=int, metavar="N",
                        help="slice, burst: decode ticks a chunked prompt yields before one chunk is granted, "
                             "0 never (wins over MLXCEL_PREFILL_GRANT_INTERVAL; default 16)")
    parser.add_argument("--max-batch-prefill", type=int, default=1, metavar="M",
                        help="classic requests one prefill tick may admit together, in one forward (default 1)")
    parser.add_argument("--mode", choices=MODES, help="scheduler mode; wins over MLXCEL_MTP_TICK_SLICE")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def build_host(args: argparse.Namespace):
    """The EngineHost these arguments describe (gates from the environment, then the flags)."""
    from coopsched.clock import RealClock
    from coopsched.env import Gates

    from .models import mlx_model, mock_model
    from .runtime import EngineHost

    gates = Gates.from_env()
    for warning in gates.warnings:
        logging.getLogger("coopsched.server").warning(warning)
    overrides = dict(slot_tokens=args.max_context, max_batch_size=args.max_batch_size,
                     num_kv_slots=args.num_slots, max_batch_prefill=args.max_batch_prefill)
    for name in ("prefill_chunk_tokens", "prefill_grant_interval"):  # a flag wins over its gate
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    if args.mode:
        overrides["mode"] = args.mode
    clock = RealClock()
    if args.backend == "mlx":
        model = mlx_model(args.model, args.draft_model)
        overrides["has_drafter"] = model.backend.has_drafter
        config = gates.scheduler_config(**overrides)
    else:
        config = gates.scheduler_config(**overrides)
        from mocks import CostModel
        cost = CostModel.load(args.cost) if args.cost else CostModel.simple(
            args.decode_ms, args.round_ms, args.prefill_ms_per_token, config.block_size)
        accept_prob = next(p for p in (args.accept_prob, cost.accept_prob, 0.7) if p is not None)
        model = mock_model(clock, cost, config.block_size, accept_prob, eos_rate=args.eos_rate)
    return EngineHost(model, config, clock, max_queue=args.max_queue)


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from coopsched.env import GateError

    from .app import create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(message)s", stream=sys.stderr)
    for name, least in (("max_context", 1), ("max_queue", 1), ("max_batch_size", 1), ("num_slots", 1),
                        ("max_batch_prefill", 1), ("prefill_chunk_tokens", 0), ("prefill_grant_interval", 0),
                        ("port", 0), ("decode_ms", 0),
                        ("round_ms", 0), ("prefill_ms_per_token", 0)):
        if getattr(args, name) is not None and getattr(args, name) < least:
            print(f"error: --{name.replace('_', '-')}={getattr(args, name)} must be >= {least}", file=sys.stderr)
            return 2
    if args.port > 65535:
        print(f"error: --port={args.port} must be at most 65535 (0 picks a free port)", file=sys.stderr)
        return 2
    try:
        host = build_host(args)
    except (GateError, ValueError, FileNotFoundError) as exc:  # a bad knob, gate or model directory
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # bind first so --port 0 works and the real port is printed before the first request
    sock = listening_socket(args.host)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        print(f"error: cannot bind {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    config = host.config
    print(f"coopsched serve: {host.model.name} listening on http://{args.host}:{port} mode={config.mode} "
          f"K={config.block_size} context={config.slot_tokens}", file=sys.stderr, flush=True)
    server = _graceful_server(uvicorn, uvicorn.Config(create_app(host), log_level="warning", access_log=False),
                              host)
    # uvicorn re-raises SIGTERM after its graceful shutdown; a handler that ignores it lets us exit 0
    signal.signal(signal.SIGTERM, lambda *_: None)
    server.run(sockets=[sock])
    return 0


def listening_socket(host: str) -> socket.socket:
    """The server's TCP socket, not yet bound. Its protocol is IPPROTO_TCP, not the default 0: asyncio sets
    TCP_NODELAY only on a connection whose socket says TCP, and without it a response's body waits behind its
    headers for the client's delayed ACK (44 ms on every request after a keep-alive connection's first)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def _graceful_server(uvicorn, config, host):
    """On SIGTERM/SIGINT every open stream first ends with an error event, then uvicorn drains."""
    from .protocol import ApiError

    class GracefulServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit:  # runs in a signal handler: hand the work to the event loop
                error = ApiError(503, "the server is shutting down", code="server_shutting_down")
                try:
                    asyncio.get_running_loop().call_soon_threadsafe(host.fail_open, error)
                except RuntimeError:  # no loop yet (still starting): nothing is open
                    pass
            super().handle_exit(sig, frame)

    return GracefulServer(config)
