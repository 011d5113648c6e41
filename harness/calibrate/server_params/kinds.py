"""What every kind's fitter takes and returns."""

from __future__ import annotations

from collections.abc import Callable

Say = Callable[[str], None]
Fitted = tuple[dict, dict, dict]  # (server_params, evidence, CostModel terms to override)
