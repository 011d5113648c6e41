"""Every check by name in one table: `coopsched run`'s (virtual.py), the locust file's and the live
rules' (live.py) and `--target`'s (target.py). A name two runners share (`classic_itl`) asks one
question of each; docs/verdicts.md lists them all.
"""

from __future__ import annotations

from harness.verdict import live, target, virtual

REGISTRIES = {"run": virtual.CHECKS, "live": live.CHECKS, "target": target.CHECKS}


def every_check() -> dict[str, dict[str, str]]:
    """Check name -> {runner: what it guards against}, names sorted."""
    named: dict[str, dict[str, str]] = {}
    for runner, checks in REGISTRIES.items():
        for name, entry in checks.items():
            named.setdefault(name, {})[runner] = entry.guards
    return dict(sorted(named.items()))
