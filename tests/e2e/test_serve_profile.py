"""`coopsched serve --cost PROFILE`: the mock drafter takes the profile's measured acceptance."""

from __future__ import annotations

import argparse
import json

import pytest

from coopsched.server import cli as server_cli

pytestmark = [pytest.mark.e2e, pytest.mark.parallel]  # the server's extra is installed in the e2e env; no wall clock


def host_for(argv: list[str]):
    parser = argparse.ArgumentParser()
    server_cli.add_arguments(parser)
    return server_cli.build_host(parser.parse_args(argv))


@pytest.mark.parametrize("profile_accept, flag, want", [
    pytest.param(0.42, [], 0.42, id="profile-wins-over-the-default"),
    pytest.param(0.42, ["--accept-prob", "0.9"], 0.9, id="the-flag-wins-over-the-profile"),
    pytest.param(None, [], 0.7, id="no-profile-value-the-default"),
])
def test_the_drafter_takes_the_profiles_acceptance(tmp_path, profile_accept, flag, want):
    profile = tmp_path / "p.json"
    profile.write_text(json.dumps({"accept_prob": profile_accept}))
    host = host_for(["--cost", str(profile), *flag])
    assert host.model.backend.drafter.accept_prob == want
