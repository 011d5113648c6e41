"""The scheduler parameters a server does not report, fitted from how it serves a few probes: one
function per server kind, each returning the twin's `server_params`, the evidence it measured (printed
as it goes) and any cost terms its model prices differently from `calibrate --target`'s fit.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.calibrate.target import Server

from .coopsched import fit_coopsched
from .kinds import Fitted, Say
from .llamacpp import fit_llama_cpp
from .mlxlm import fit_mlx_lm
from .vllm import fit_vllm

FITTERS: dict[str, Callable[[Server, dict, dict, Say], Fitted]] = {
    "coopsched": fit_coopsched, "mlx-lm": fit_mlx_lm, "llama.cpp": fit_llama_cpp, "vllm": fit_vllm}


def fit_params(kind: str, server: Server, profile: dict, fitted: dict, say: Say | None = None) -> Fitted:
    """For a `kind` server whose cost terms are `profile` (CostModel keys) and `fitted` the
    calibration's own fit record (its TTFT points)."""
    fitter = FITTERS.get(kind)
    return fitter(server, profile, fitted, say or (lambda _: None)) if fitter else ({}, {}, {})
