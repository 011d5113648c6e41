"""`--report-dir DIR`: check an existing `coopsched report` output (tox -e bench passes the one it made)."""


def pytest_addoption(parser):
    parser.addoption("--report-dir", default=None,
                     help="a coopsched report directory to open (default: build one, about 1-2 minutes)")
