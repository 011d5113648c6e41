"""Scheduler models of the servers people run, for the twin: each plans one step as the server
does, behind the same plan / result / commit seam as coopsched's own scheduler.

`make_scheduler(kind, config, params)` gives the reference Scheduler for "coopsched" (and for
"unknown": a server whose kind was not recognised is simulated as the reference), else the kind's model.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from coopsched.core.config import SchedulerConfig
from coopsched.core.scheduler import Scheduler

from .base import Param, StepModel, ms_value

KINDS = ("coopsched", "vllm", "mlx-lm", "llama.cpp")
UNKNOWN = "unknown"  # detection found no kind: the reference is simulated, and the run says so
_MODELS = {"vllm": "coopsched.twins.vllm:VllmModel", "mlx-lm": "coopsched.twins.mlxlm:MlxLmModel",
           "llama.cpp": "coopsched.twins.llamacpp:LlamaCppModel"}


def model_class(kind: str) -> type[StepModel]:
    """The model class of a kind other than the reference."""
    if kind not in _MODELS:
        raise ValueError(f"server kind {kind!r}: want one of {', '.join((*KINDS, UNKNOWN))}")
    module, name = _MODELS[kind].split(":")
    try:
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"server kind {kind!r}: its scheduler model is not available ({exc})") from exc


# coopsched serve's own twin: its scheduler's knobs are the [scheduler] table; only the HTTP layer is a param
REFERENCE_PARAMS = (Param("frontend_ms", 0.0, "(coopsched serve's HTTP layer: no flag)",
                          "from a client's send to the engine seeing the request, and from a tick's end to the "
                          "client seeing its tokens: a TTFT's part outside the engine's ticks"),
                    Param("frontend_stall_ms", 0.0, "(the HTTP layer sharing the engine's core: no flag)",
                          "ms of the engine's core each arrival's HTTP work takes from its send (a server pinned "
                          "to one core): a tick it overlaps is stretched by it (0: a core of its own)"))


def reference_params(kind: str, params: Mapping[str, object] | None) -> dict[str, float]:
    """The reference twin's params (REFERENCE_PARAMS, each a number of ms >= 0); anything else is refused."""
    known = {p.name: p.default for p in REFERENCE_PARAMS}
    unknown = sorted(set(params or {}) - set(known))
    if unknown:
        raise ValueError(f"server_params {', '.join(map(repr, unknown))}: a {kind} twin runs coopsched's "
                         f"scheduler, whose knobs are the scenario's [scheduler] table (accepted: {', '.join(known)})")
    return {name: ms_value(kind, name, value) for name, value in {**known, **(params or {})}.items()}


def make_scheduler(kind: str, config: SchedulerConfig, params: Mapping[str, object] | None = None, *,
                   keep_history: bool = True) -> Scheduler | StepModel:
    """The scheduler a twin of a `kind` server runs: the reference, or the kind's model."""
    if kind in ("coopsched", UNKNOWN):
        reference_params(kind, params)
        return Scheduler(config, keep_history=keep_history)
    return model_class(kind)(config, params, keep_history=keep_history)


__all__ = ["KINDS", "REFERENCE_PARAMS", "UNKNOWN", "Param", "StepModel", "make_scheduler", "model_class",
           "reference_params"]
