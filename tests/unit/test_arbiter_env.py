"""The HOL budget knob: COOPSCHED_HOL_BUDGET_MS (golden table) and --hol-budget-ms, which wins over it.

tests/golden/hol_budget.json pins (raw value) -> parsed decision; a change must be deliberate
(rerun with COOPSCHED_UPDATE_GOLDEN=1 and review the diff), as for the MLXCEL_* gates.
"""

import json
import os
from pathlib import Path

import pytest

from coopsched.cli import main as cli
from coopsched.env import KNOB_NAMES, GateError, Gates
from harness.run import runner, scenario

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "hol_budget.json"
KNOB = "COOPSCHED_HOL_BUDGET_MS"
RAW_VALUES = ["50", "30", " 12.5 ", "\t7\n", "+8", ".5", "5.", "0.001", "1e3", "inf", "nan", "NaN",
              "", " ", "eight", "1_0", "１２", "12ms", "1,5", "0", "0.0", "+0", "-3", "-0.5", "1000000"]


def decision(raw: str | None) -> object:
    try:
        gates = Gates.parse({} if raw is None else {KNOB: raw})
    except GateError as exc:
        return f"startup error: {exc}"
    return {"value": gates.hol_budget_ms, "warnings": list(gates.warnings)} if gates.warnings \
        else gates.hol_budget_ms


def test_golden():
    current = {"<unset>" if raw is None else raw: decision(raw) for raw in [None, *RAW_VALUES]}
    if os.environ.get("COOPSCHED_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(current, indent=1, ensure_ascii=False) + "\n")
    assert current == json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.mark.parametrize("raw, expected", [
    pytest.param(None, 50.0, id="unset-default"),
    pytest.param(" 12.5 ", 12.5, id="trimmed-decimal"),
    pytest.param("+8", 8.0, id="plus"),
    pytest.param("1e3", 50.0, id="exponent-warns"),
    pytest.param("inf", 50.0, id="inf-warns"),
    pytest.param("１２", 50.0, id="fullwidth-warns"),
])
def test_spot_checks(raw, expected):
    assert Gates.parse({} if raw is None else {KNOB: raw}).hol_budget_ms == expected


@pytest.mark.parametrize("raw", ["0", "-3", "0.0"])
def test_non_positive_is_a_startup_error_naming_the_value(raw):
    with pytest.raises(GateError, match=f"{KNOB}={raw!r}"):
        Gates.parse({KNOB: raw})


def test_the_knob_is_read_from_the_environment_and_reaches_the_config(monkeypatch):
    assert KNOB in KNOB_NAMES
    monkeypatch.setenv(KNOB, "33")
    config = runner.scenario_config(scenario.load("concurrency2"), "cost")
    assert config.hol_budget_ms == 33.0 and config.mode == "cost"


def test_cli_flag_wins_over_the_environment_and_sets_the_bound(monkeypatch, tmp_path):
    monkeypatch.setenv(KNOB, "80")
    out = tmp_path / "t.json"
    assert cli(["run", "concurrency2", "--mode", "cost", "--json", str(out)]) == 0
    assert {c["name"]: c for c in json.loads(out.read_text())[0]["checks"]}["classic_itl"]["bound"] == 80.0
    assert cli(["run", "concurrency2", "--mode", "cost", "--hol-budget-ms", "30", "--json", str(out)]) == 0
    itl = {c["name"]: c for c in json.loads(out.read_text())[0]["checks"]}["classic_itl"]
    assert itl["bound"] == 30.0 and itl["value"] <= 30.0


@pytest.mark.parametrize("raw", ["0", "-1", "fast"])
def test_cli_rejects_a_bad_budget(raw, capsys):
    with pytest.raises(SystemExit) as exc:
        cli(["run", "concurrency2", "--mode", "cost", "--hol-budget-ms", raw])
    assert exc.value.code == 2 and "--hol-budget-ms" in capsys.readouterr().err
