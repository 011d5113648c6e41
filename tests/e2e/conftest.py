"""Shared fixtures of the e2e tests (helpers live in e2e_servers.py)."""

from __future__ import annotations

import pytest
from e2e_servers import serve

pytest.register_assert_rewrite("interop_runs")  # its shared checks report as a test's own asserts


@pytest.fixture(scope="module")
def server():
    """A fast mock server shared by a module: 1 ms decode, 4 ms rounds."""
    with serve("--decode-ms", "1", "--round-ms", "4") as served:
        yield served
