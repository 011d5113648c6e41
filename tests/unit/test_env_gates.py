"""Golden tables: (gate, raw value) -> parsed decision, and (request shape x gates) -> dispatch.

The golden files under tests/golden/ pin today's semantics; a change to either
table must be deliberate (rerun with COOPSCHED_UPDATE_GOLDEN=1 and review the diff).
"""

import json
import os
from pathlib import Path

import pytest

from coopsched.core import Request, SchedulerConfig
from coopsched.core.dispatch import dispatch
from coopsched.env import GATE_NAMES, GateError, Gates

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
RAW_VALUES = ["1", "0", "true", "false", "True", "False", "TRUE", "FALSE", "yes", "no", "on", "off",
              "OFF", "", " 0", " 12 ", "\t3\n", "+8", "-3", "8.5", "eight", "1_0", "１２", "2", "1",
              "auto", "mtp", "dflash", "DFLASH",
              # upstream's spellings for the grant interval, the mixed step and the chunk
              "4", "TrUe", "YES", "ON", "On", " on ", "\ttrue\n", "abc", "16x", "maybe", "+", "-0", "0000",
              "\u00a012\u3000", "\u2003", "\x1c12", "4294967295", "4294967296", "18446744073709551616"]
FIELD = {
    "MLXCEL_MTP_TICK_SLICE": "tick_slice", "MLXCEL_MTP_SLICE_GRANT_ROUNDS": "grant_rounds",
    "MLXCEL_ENABLE_MTP_B1": "mtp_b1", "MLXCEL_ENABLE_MTP_BATCH": "mtp_batch",
    "MLXCEL_ENABLE_MTP_BATCH_RAGGED": "mtp_batch_ragged", "MLXCEL_DRAFT_BLOCK_SIZE": "draft_block_size",
    "MLXCEL_DRAFT_KIND": "draft_kind", "MLXCEL_PREFILL_GRANT_INTERVAL": "prefill_grant_interval",
    "MLXCEL_MIXED_STEP": "mixed_step", "MLXCEL_PREFILL_CHUNK": "prefill_chunk_tokens",
}


def decision(gate: str, raw: str | None) -> object:
    try:
        gates = Gates.parse({} if raw is None else {gate: raw})
    except GateError as exc:
        return f"startup error: {exc}"
    value = getattr(gates, FIELD[gate])
    return {"value": value, "warnings": list(gates.warnings)} if gates.warnings else value


def gate_table() -> dict:
    return {gate: {"<unset>" if raw is None else raw: decision(gate, raw) for raw in [None, *RAW_VALUES]}
            for gate in GATE_NAMES}


SHAPES = {
    "opted-out": dict(speculative=False),
    "eligible-alone": dict(),
    "eligible-with-sibling": dict(siblings=1),
    "eligible-slot-busy": dict(slot_busy=True),
    "eligible-slot-busy-backlog-full": dict(slot_busy=True, backlog_has_room=False),
}
GATE_SETS = {
    "defaults": {},
    "b1-off": {"MLXCEL_ENABLE_MTP_B1": "0"},
    "b1-FALSE-is-off": {"MLXCEL_ENABLE_MTP_B1": "FALSE"},
    "b1-False-forces-on": {"MLXCEL_ENABLE_MTP_B1": "False"},
    "batch-on": {"MLXCEL_ENABLE_MTP_BATCH": "1"},
    "batch-on-b1-off": {"MLXCEL_ENABLE_MTP_BATCH": "yes", "MLXCEL_ENABLE_MTP_B1": "off"},
    "batch-True-is-off": {"MLXCEL_ENABLE_MTP_BATCH": "True"},
    "no-rotation": {"MLXCEL_MTP_SLICE_GRANT_ROUNDS": "0"},
    "legacy-burst": {"MLXCEL_MTP_TICK_SLICE": "0"},
}


def dispatch_table() -> dict:
    table = {}
    for gate_name, raw in GATE_SETS.items():
        config = Gates.parse(raw).scheduler_config()
        for shape_name, shape in SHAPES.items():
            request = Request("r", (1, 2, 3), 8, speculative=shape.get("speculative", True))
            route = dispatch(request, config, slot_busy=shape.get("slot_busy", False),
                             backlog_has_room=shape.get("backlog_has_room", True),
                             num_siblings=shape.get("siblings", 0))
            table.setdefault(gate_name, {})[shape_name] = route.value
    return table


@pytest.mark.parametrize("name, build", [("gates", gate_table), ("dispatch", dispatch_table)])
def test_golden(name, build):
    path = GOLDEN / f"{name}.json"
    current = build()
    if os.environ.get("COOPSCHED_UPDATE_GOLDEN"):
        path.write_text(json.dumps(current, indent=1, ensure_ascii=False) + "\n")
    assert current == json.loads(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("gate, raw, expected", [
    pytest.param("MLXCEL_MTP_TICK_SLICE", "False", True, id="slice-False-is-on"),
    pytest.param("MLXCEL_MTP_TICK_SLICE", "FALSE", False, id="slice-FALSE-is-off"),
    pytest.param("MLXCEL_MTP_TICK_SLICE", "OFF", True, id="slice-OFF-is-on"),
    pytest.param("MLXCEL_MTP_TICK_SLICE", "", True, id="slice-empty-is-on"),
    pytest.param("MLXCEL_MTP_SLICE_GRANT_ROUNDS", " 12 ", 12, id="grant-trimmed"),
    pytest.param("MLXCEL_MTP_SLICE_GRANT_ROUNDS", "+8", 8, id="grant-plus"),
    pytest.param("MLXCEL_MTP_SLICE_GRANT_ROUNDS", "0", 0, id="grant-zero"),
    pytest.param("MLXCEL_MTP_SLICE_GRANT_ROUNDS", "-3", 8, id="grant-negative-default"),
    pytest.param("MLXCEL_MTP_SLICE_GRANT_ROUNDS", "１２", 8, id="grant-fullwidth-default"),
    pytest.param("MLXCEL_MTP_SLICE_GRANT_ROUNDS", "1_0", 8, id="grant-underscore-default"),
    pytest.param("MLXCEL_ENABLE_MTP_B1", "no", False, id="b1-no-off"),
    pytest.param("MLXCEL_ENABLE_MTP_B1", "OFF", True, id="b1-OFF-forces-on"),
    pytest.param("MLXCEL_ENABLE_MTP_BATCH", "TRUE", True, id="batch-TRUE"),
    pytest.param("MLXCEL_ENABLE_MTP_BATCH", "True", False, id="batch-True-off"),
    pytest.param("MLXCEL_DRAFT_BLOCK_SIZE", " 6 ", 6, id="block-trimmed"),
])
def test_gate_spot_checks(gate, raw, expected):
    assert decision(gate, raw) == expected


@pytest.mark.parametrize("gate, raw", [("MLXCEL_DRAFT_KIND", "DFLASH"), ("MLXCEL_DRAFT_KIND", ""),
                                       ("MLXCEL_DRAFT_BLOCK_SIZE", "1"), ("MLXCEL_DRAFT_BLOCK_SIZE", "-3")])
def test_startup_errors_name_the_value(gate, raw):
    with pytest.raises(GateError, match=f"{gate}={raw!r}"):
        Gates.parse({gate: raw})


def test_unparseable_block_size_warns_and_keeps_default():
    gates = Gates.parse({"MLXCEL_DRAFT_BLOCK_SIZE": "eight"})
    assert gates.draft_block_size == 4 and "'eight'" in gates.warnings[0]


def test_environment_wins_over_scenario_defaults(monkeypatch):
    monkeypatch.setenv("MLXCEL_ENABLE_MTP_BATCH", "0")
    assert Gates.from_env({"MLXCEL_ENABLE_MTP_BATCH": "1"}).mtp_batch is False
    monkeypatch.delenv("MLXCEL_ENABLE_MTP_BATCH")
    assert Gates.from_env({"MLXCEL_ENABLE_MTP_BATCH": "1"}).mtp_batch is True


def test_dflash_is_never_sliced():
    config = Gates.parse({"MLXCEL_DRAFT_KIND": "dflash"}).scheduler_config()
    assert config.mode == "slice" and not config.is_sliced
    assert SchedulerConfig(mode="slice").is_sliced and not SchedulerConfig(mode="burst").is_sliced


def test_ragged_needs_batch():
    assert not Gates.parse({"MLXCEL_ENABLE_MTP_BATCH_RAGGED": "1"}).scheduler_config().enable_ragged
    both = {"MLXCEL_ENABLE_MTP_BATCH_RAGGED": "1", "MLXCEL_ENABLE_MTP_BATCH": "1"}
    assert Gates.parse(both).scheduler_config().enable_ragged


@pytest.mark.parametrize("raw, expected", [
    *[pytest.param(raw, value, id=f"interval-{raw!r}") for raw, value in
      [("4", 4), (" 12 ", 12), ("1", 1), (None, 16), ("0", 0)]],
    *[pytest.param(raw, 16, id=f"interval-garbage-{raw!r}") for raw in ["", "abc", "-3", "8.5", "eight", "16x"]],
    pytest.param("\u00a012\u3000", 12, id="interval-unicode-whitespace-trimmed"),
    pytest.param("4294967295", 2**32 - 1, id="interval-u32-max"),
    pytest.param("4294967296", 16, id="interval-overflow"),
])
def test_prefill_grant_interval_spellings(raw, expected):
    assert decision("MLXCEL_PREFILL_GRANT_INTERVAL", raw) == expected


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "True", "TrUe", "yes", "YES", "on", "ON", "On", " on ",
                                 "\ttrue\n"])
def test_mixed_step_on(raw):
    assert decision("MLXCEL_MIXED_STEP", raw) is True


@pytest.mark.parametrize("raw", [None, "", "0", "false", "off", "maybe", "2"])
def test_mixed_step_off(raw):
    assert decision("MLXCEL_MIXED_STEP", raw) is False


def test_prefill_chunk_gate():
    assert decision("MLXCEL_PREFILL_CHUNK", None) == 2048 and decision("MLXCEL_PREFILL_CHUNK", "0") == 0
    gates = Gates.parse({"MLXCEL_PREFILL_CHUNK": "lots"})
    assert gates.prefill_chunk_tokens == 2048 and "'lots'" in gates.warnings[0]
    assert Gates.parse({"MLXCEL_PREFILL_CHUNK": " 256 "}).scheduler_config().prefill_chunk_tokens == 256
    # unset, the scheduler keeps its own default (whole prompts); a flag or [scheduler] key wins over the gate
    assert Gates.parse({}).scheduler_config().prefill_chunk_tokens == 0
    set_gate = Gates.parse({"MLXCEL_PREFILL_CHUNK": "256"})
    assert set_gate.scheduler_config(prefill_chunk_tokens=64).prefill_chunk_tokens == 64
