"""Deterministic mock model: target, drafter, byte tokenizer and a cost model in ms."""

from .backend import MockBackend
from .cost import CostModel
from .model import MockDrafter, MockTarget
from .tokenizer import ByteTokenizer

__all__ = ["ByteTokenizer", "CostModel", "MockBackend", "MockDrafter", "MockTarget"]
