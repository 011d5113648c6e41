"""What the server serves: a backend plus its tokenizer, name and (for the mock) its costs.

The mock reports its cost terms on /health so load tools can compute the
scheduling bound; a real backend reports none (clients then measure solo runs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

MOCK_MODEL_NAME = "coopsched-mock"


@dataclass
class ServedModel:
    name: str
    backend: object                                   # a ModelBackend
    encode: Callable[[str], list[int]]
    encode_chat: Callable[[list[dict]], list[int]]
    detokenize: Callable[[Sequence[int]], str]
    vocab_size: int
    costs: dict | None = None                         # cost terms in ms, None for a real model
    aliases: tuple[str, ...] = ()

    def answers_to(self, name: str) -> bool:
        return name == self.name or name in self.aliases


def plain_chat_template(messages: list[dict]) -> str:
    """The mock has no chat template: one `role: content` line per message, then the reply cue."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


def mock_model(clock, cost, block_size: int, accept_prob: float = 0.7, seed: int = 0,
               eos_rate: float = 0.0) -> ServedModel:
    from mocks import MockBackend, MockDrafter, MockTarget

    backend = MockBackend(clock, cost, target=MockTarget(eos_rate=eos_rate),
                          drafter=MockDrafter(accept_prob, seed=seed))
    tokenizer = backend.tokenizer
    costs = {
        "decode_ms": cost.decode(1),
        "round_ms": cost.round(block_size, 1),
        "slice0_fixed_ms": cost.prefill_fixed_ms,
        "slice0_per_token_ms": cost.prefill_per_token_ms + cost.draft_prefill_per_token_ms,
        "prefill_fixed_ms": cost.prefill_fixed_ms,
        "prefill_per_token_ms": cost.prefill_per_token_ms,
        "block_size": block_size,
        "jitter": cost.jitter,
        "profile": cost.to_json(),
    }
    return ServedModel(MOCK_MODEL_NAME, backend, tokenizer.encode,
                       lambda messages: tokenizer.encode(plain_chat_template(messages)),
                       backend.detokenize, tokenizer.vocab_size, costs)


def mlx_model(model_dir: Path | None, draft_dir: Path | None) -> ServedModel:
    """The MLX backend (tiny models built once when no --model), with its tokenizer's chat template."""
    try:
        from coopsched.backends.mlx_backend import make_mlx_backend
    except ImportError as exc:
        raise SystemExit(f"--backend mlx needs the mlx extra (pip install -e '.[mlx]'): {exc}") from exc
    backend = make_mlx_backend(model_dir, draft_dir)
    hf = getattr(backend.tokenizer, "_tokenizer", backend.tokenizer)  # mlx-lm wraps an HF tokenizer

    def encode_chat(messages: list[dict]) -> list[int]:
        if getattr(hf, "chat_template", None):
            return list(hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
        return backend.encode(plain_chat_template(messages))

    vocab_size = int(getattr(getattr(backend.model, "args", None), "vocab_size", 0) or len(hf))
    aliases = tuple(str(p) for p in {model_dir, backend.model_dir} if p is not None)
    return ServedModel(backend.model_dir.name, backend, backend.encode, encode_chat, backend.detokenize,
                       vocab_size, None, aliases)
