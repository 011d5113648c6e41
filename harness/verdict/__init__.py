"""One way to judge: every verdict is a `Check` record (check.py) made by a registered check function
(virtual.py for `coopsched run`, live.py for servers over HTTP and locust). A check holds, fails
or is skipped with its reason; a skipped check never counts as holding (docs/verdicts.md)."""
