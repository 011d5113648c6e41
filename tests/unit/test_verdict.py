"""The check record and its tally: a skipped check never counts as holding, and the last line says so."""

from __future__ import annotations

import pytest

from harness.verdict.check import FAIL, Check, Tally, record, state


def test_a_skipped_check_has_no_verdict_and_says_why():
    c = Check.skip("classic_itl", "no request was served speculatively")
    assert c.skipped and c.ok is None and state(c) == "skipped"
    d = c.to_json()
    assert d["ok"] is None and d["skipped"] is True and d["note"] == "no request was served speculatively"
    assert {"name", "ok", "value", "bound"} <= set(d)


def test_a_must_fail_check_is_ok_when_it_fails_and_not_when_it_holds():
    assert Check("classic_itl", False, 795.0, 35.0, expect=FAIL).ok is True
    assert Check("classic_itl", True, 20.0, 35.0, expect=FAIL).ok is False
    assert Check("classic_itl", True, 20.0, 35.0).ok is True and Check("classic_itl", False, 1, 0).ok is False


def test_the_trace_dict_keeps_its_keys_and_round_trips():
    d = Check("burst_wall", True, 20.0000001, 21.0, note="rule", extra={"stalls": {"hol": 0}}).to_json()
    assert d == {"name": "burst_wall", "ok": True, "holds": True, "value": 20.0, "bound": 21.0, "expect": "pass",
                 "note": "rule", "stalls": {"hol": 0}}
    assert "skipped" not in d  # only a skipped check carries the key: traces without a skip keep their bytes
    assert Check.from_json(d).to_json() == d
    assert Check.from_json(record("x", None, note="why")).skipped


def test_an_older_trace_whose_skip_said_ok_true_is_still_read_as_skipped():
    old = {"name": "rotation", "ok": True, "skipped": True, "value": None, "bound": None, "note": "legacy"}
    assert state(old) == "skipped" and Tally.of([("a", old)]).held == 0


def test_all_hold_only_when_nothing_was_skipped():
    held = [("a", Check("a", True, 1, 1)), ("b", Check("b", True, 1, 1))]
    assert Tally.of(held).line(2) == "all 2 expectations hold across 2 runs"
    skipped = held + [("c", Check.skip("c", "no spec")), ("d", Check.skip("d", "no spec"))]
    tally = Tally.of(skipped)
    assert tally.line(1) == "2 hold, 2 skipped (no spec) across 1 run"
    assert tally.ok() and not tally.ok(strict=True)


@pytest.mark.parametrize("strict", [False, True])
def test_a_failure_is_named_before_the_held_and_fails_either_way(strict):
    tally = Tally.of([("a", Check("a", False, 2, 1)), ("b", Check("b", True, 1, 1)),
                      ("c", Check.skip("c", "off")), ("d", Check.skip("d", "other"))])
    assert tally.line() == "1 failed, 1 hold, 2 skipped (1: off; 1: other)"
    assert tally.failed == ("a",) and not tally.ok(strict)


def test_one_registry_names_every_check_and_the_verdicts_page_lists_them():
    from pathlib import Path

    from harness.verdict import live, target, virtual
    from harness.verdict.registry import every_check

    named = every_check()
    assert set(named) == set(virtual.CHECKS) | set(live.CHECKS) | set(target.CHECKS)
    assert set(named["classic_itl"]) == {"run", "live", "target"}  # one name, asked by each runner
    assert set(named["stall_vs_solo"]) == {"target"}
    page = (Path(__file__).resolve().parents[2] / "docs" / "verdicts.md").read_text()
    assert [n for n in named if f"`{n}`" not in page] == []
