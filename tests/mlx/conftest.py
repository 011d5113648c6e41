"""Fixtures of the MLX tests: tiny models built once per session into a tmp dir, an oracle
(mlx-lm's own greedy generate_step), prompts, and a run helper. Nothing is downloaded:
HF_HUB_OFFLINE=1 and any non-loopback connection fails the session."""

from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"  # before mlx_lm / huggingface_hub read it
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from mlx_helpers import BLOCK_SIZE, MAX_TOKENS, NUM_PROMPTS  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402

from coopsched.backends import model_build  # noqa: E402
from coopsched.backends.mlx_backend import MlxBackend  # noqa: E402

LOOPBACK = ("127.0.0.1", "::1", "localhost")


@pytest.fixture(scope="session", autouse=True)
def no_network():
    """Offline for real: a connection anywhere but loopback is a test failure."""
    real_connect = socket.socket.connect

    def guarded(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if self.family in (socket.AF_INET, socket.AF_INET6) and host not in LOOPBACK:
            raise AssertionError(f"network access to {address!r} during the MLX tests")
        return real_connect(self, address)

    socket.socket.connect = guarded
    yield
    socket.socket.connect = real_connect


@dataclass(frozen=True)
class Models:
    target: Path
    draft: Path        # noise 0.05
    draft_noisy: Path  # noise 0.2


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> Models:
    root = tmp_path_factory.mktemp("models")
    target = model_build.build_target(root / "target", seed=0, size="s")
    return Models(target, model_build.build_drafter(root / "draft-0.05", target, 0.05, seed=0),
                  model_build.build_drafter(root / "draft-0.2", target, 0.2, seed=0))


@pytest.fixture(scope="session")
def loaded(models) -> MlxBackend:
    return MlxBackend(models.target, models.draft)


@pytest.fixture
def backend(loaded) -> MlxBackend:
    """A backend with no live sequences, sharing the session's loaded weights."""
    return loaded.fresh()


@pytest.fixture(scope="session")
def oracle(loaded):
    """prompt -> the target's greedy tokens from mlx_lm.generate.generate_step (memoized)."""
    memo: dict[tuple[int, ...], list[int]] = {}

    def tokens(prompt, num_tokens: int = MAX_TOKENS + BLOCK_SIZE, model=None) -> list[int]:
        key = (tuple(prompt), num_tokens, id(model))
        if key not in memo:
            steps = generate_step(mx.array(list(prompt)), model or loaded.model, max_tokens=num_tokens)
            memo[key] = [int(t) for t, _ in steps]
        return memo[key][:num_tokens]
    return tokens


@pytest.fixture(scope="session")
def printable_ids() -> list[int]:
    suppressed = set(model_build.suppressed_ids(model_build.build_tokenizer()))
    return [i for i in range(model_build.VOCAB_SIZE) if i not in suppressed]


@pytest.fixture(scope="session")
def prompts(printable_ids) -> list[tuple[int, ...]]:
    """NUM_PROMPTS prompts of mixed lengths (3..24 tokens), seeded."""
    rng = random.Random(0)
    return [tuple(rng.choice(printable_ids) for _ in range(rng.randint(3, 24))) for _ in range(NUM_PROMPTS)]


@pytest.fixture(scope="session")
def equal_prompts(printable_ids) -> list[tuple[int, ...]]:
    """NUM_PROMPTS prompts of 12 tokens each: window siblings need equal lengths."""
    rng = random.Random(1)
    return [tuple(rng.choice(printable_ids) for _ in range(12)) for _ in range(NUM_PROMPTS)]
