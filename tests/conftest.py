"""Hypothesis profiles, chosen by HYPOTHESIS_PROFILE (tox sets `ci`; default `dev`); -k and exit 5.

dev: quick local runs; ci: derandomized (the same examples every run) and a bit
deeper; deep: a long hunt (`HYPOTHESIS_PROFILE=deep pytest tests/property`).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("dev", max_examples=60, stateful_step_count=40, **_COMMON)
settings.register_profile("ci", max_examples=300, stateful_step_count=50, derandomize=True, **_COMMON)
settings.register_profile("deep", max_examples=5000, stateful_step_count=120, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_sessionfinish(session, exitstatus):
    """`tox -e e2e -- -k NAME` runs several pytest groups: one that NAME selects nothing in is not a
    failure. Without -k, collecting nothing still exits 5 (CI fails an env that checks nothing)."""
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and session.config.option.keyword:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"-k {session.config.option.keyword!r} selects no test of this group: exit 0")
        session.exitstatus = pytest.ExitCode.OK
