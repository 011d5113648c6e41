"""One way to judge: every verdict is a `Check` record (check.py) made by a registered check function:
virtual.py for `coopsched run`, live.py for locust and live servers, slo.py for `coopsched judge`.
A check holds, fails or is skipped with its reason; a skip never counts as holding (docs/verdicts.md)."""
