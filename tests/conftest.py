"""Hypothesis profiles, chosen by HYPOTHESIS_PROFILE (tox sets `ci`; default `dev`).

dev: quick local runs; ci: derandomized (the same examples every run) and a bit
deeper; deep: a long hunt (`HYPOTHESIS_PROFILE=deep pytest tests/property`).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("dev", max_examples=60, stateful_step_count=40, **_COMMON)
settings.register_profile("ci", max_examples=300, stateful_step_count=50, derandomize=True, **_COMMON)
settings.register_profile("deep", max_examples=5000, stateful_step_count=120, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
