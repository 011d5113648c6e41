"""`coopsched model build`: offline, seeded, byte-identical; greedy decoding of the tiny
model runs to max_tokens with one printable chunk per token."""

from __future__ import annotations

import os

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from coopsched import cli
from coopsched.backends import model_build
from coopsched.backends.mlx_backend import load_model

pytestmark = pytest.mark.mlx


def files(path):
    return {f.name: f.read_bytes() for f in sorted(path.iterdir())}


def test_same_seed_same_bytes_other_seed_other_weights(models, tmp_path):
    again = model_build.build_target(tmp_path / "again", seed=0, size="s")
    assert files(again) == files(models.target)
    assert files(model_build.build_drafter(tmp_path / "d", again, 0.05, seed=0)) == files(models.draft)
    other = model_build.build_target(tmp_path / "other", seed=1, size="s")
    assert files(other)["model.safetensors"] != files(models.target)["model.safetensors"]
    assert files(other)["tokenizer.json"] == files(models.target)["tokenizer.json"]


def test_loads_offline_with_a_padded_vocab(models):
    import huggingface_hub.constants

    assert os.environ["HF_HUB_OFFLINE"] == "1" and huggingface_hub.constants.HF_HUB_OFFLINE
    for path in (models.target, models.draft):
        model, tokenizer = load_model(path)
        assert model.args.vocab_size == len(tokenizer.vocab) == model_build.VOCAB_SIZE
        assert tokenizer.eos_token_id == model_build.build_tokenizer().token_to_id(model_build.EOS_TOKEN)


def test_greedy_runs_to_max_tokens_one_printable_chunk_per_token(loaded, prompts):
    suppressed = set(model_build.suppressed_ids(model_build.build_tokenizer()))
    for prompt in prompts[:5]:
        tokens = [int(t) for t, _ in generate_step(mx.array(list(prompt)), loaded.model, max_tokens=64)]
        assert len(tokens) == 64 and not suppressed & set(tokens)
        detokenizer = loaded.tokenizer.detokenizer
        detokenizer.reset()
        for token in tokens:  # the streaming detokenizer holds nothing back
            detokenizer.add_token(token)
            chunk = detokenizer.last_segment
            assert chunk and chunk.isprintable(), (token, chunk)


def test_cli_builds_target_and_drafter(tmp_path, models, capsys):
    assert cli.main(["model", "build", "--out", str(tmp_path / "t"), "--seed", "0"]) == 0
    assert files(tmp_path / "t") == files(models.target)
    assert cli.main(["model", "build", "--out", str(tmp_path / "d"), "--from", str(tmp_path / "t"),
                     "--noise", "0.2"]) == 0
    assert files(tmp_path / "d") == files(models.draft_noisy)
    assert cli.main(["model", "build", "--out", str(tmp_path / "x"), "--noise", "0.2"]) == 2
    assert cli.main(["model", "build", "--out", str(tmp_path / "y"), "--from", str(tmp_path / "nope")]) == 2
    assert "not a model directory" in " ".join(capsys.readouterr().err.split())


def test_cache_builds_once_then_reuses(tmp_path):
    target, draft = model_build.ensure_tiny_models(tmp_path)
    assert model_build.is_model_dir(target) and model_build.is_model_dir(draft)
    stamps = {f: f.stat().st_mtime_ns for f in [*target.iterdir(), *draft.iterdir()]}
    assert model_build.ensure_tiny_models(tmp_path) == (target, draft)
    assert {f: f.stat().st_mtime_ns for f in stamps} == stamps
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, draft.name])  # no temp left
