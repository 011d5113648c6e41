"""`coopsched model export --format gguf`, read back with the gguf package's own reader: llama
metadata from config.json, every tensor float32 in the shape llama.cpp expects, Q and K rows
permuted as llama.cpp's converter permutes them, the tokenizer's tokens and merges, EOS, no BOS.
(Greedy parity over llama-server: tests/e2e/test_llamacpp.py.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from coopsched import cli
from coopsched.backends import gguf_export

gguf = pytest.importorskip("gguf")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

pytestmark = pytest.mark.mlx


def field(reader, key):
    return reader.fields[key].contents()


@pytest.fixture(scope="module")
def exported(models, tmp_path_factory):
    out = tmp_path_factory.mktemp("gguf") / "target.gguf"
    assert cli.main(["model", "export", "--format", "gguf", "--out", str(out), "--from", str(models.target)]) == 0
    return gguf.GGUFReader(out)


def test_metadata_and_tokenizer(exported, models):
    config = json.loads((models.target / "config.json").read_text())
    tokenizer = json.loads((models.target / "tokenizer.json").read_text())
    assert field(exported, "general.architecture") == "llama"
    assert field(exported, "llama.block_count") == config["num_hidden_layers"]
    assert field(exported, "llama.embedding_length") == config["hidden_size"]
    assert field(exported, "llama.attention.head_count") == config["num_attention_heads"]
    assert field(exported, "llama.context_length") == config["max_position_embeddings"]
    assert field(exported, "llama.rope.dimension_count") == config["hidden_size"] // config["num_attention_heads"]
    assert field(exported, "tokenizer.ggml.model") == "gpt2" and field(exported, "tokenizer.ggml.pre") == "gpt-2"
    tokens = field(exported, "tokenizer.ggml.tokens")
    assert len(tokens) == config["vocab_size"] and tokens[0] == "<|endoftext|>"
    assert all(tokens[i] == t for t, i in tokenizer["model"]["vocab"].items())
    assert field(exported, "tokenizer.ggml.merges") == [" ".join(m) for m in tokenizer["model"]["merges"]]
    assert field(exported, "tokenizer.ggml.eos_token_id") == config["eos_token_id"] == 0
    assert field(exported, "tokenizer.ggml.add_bos_token") is False
    assert "tokenizer.ggml.bos_token_id" not in exported.fields
    control = int(gguf.TokenType.CONTROL)
    assert field(exported, "tokenizer.ggml.token_type")[0] == control  # EOS is a special, not text


def test_tensors_are_f32_with_q_and_k_permuted(exported, models):
    weights = safetensors_numpy.load_file(str(models.target / "model.safetensors"))
    heads = json.loads((models.target / "config.json").read_text())["num_attention_heads"]
    tensors = {t.name: t for t in exported.tensors}
    assert len(tensors) == len(weights)
    assert {t.tensor_type for t in exported.tensors} == {gguf.GGMLQuantizationType.F32}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    source = {names.get_name(n, try_suffixes=(".weight",)): w for n, w in weights.items()}
    got = lambda name: np.asarray(tensors[name].data).reshape(source[name].shape)
    assert np.array_equal(got("token_embd.weight"), weights["model.embed_tokens.weight"])
    assert np.array_equal(got("blk.1.ffn_down.weight"), weights["model.layers.1.mlp.down_proj.weight"])
    q = weights["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(got("blk.0.attn_q.weight"), q)  # reordered ...
    assert np.array_equal(got("blk.0.attn_q.weight"), gguf_export.permute_for_rope(q, heads))  # ... as llama.cpp's
    # the permutation moves row 1 of each head (the second of its first half) to row 2 (pairs)
    head_dim = q.shape[0] // heads
    k = weights["model.layers.0.self_attn.k_proj.weight"]
    assert np.array_equal(got("blk.0.attn_k.weight")[2], k[1])
    assert np.array_equal(got("blk.0.attn_k.weight")[1], k[head_dim // 2])


def test_bad_inputs_are_one_line_errors(tmp_path, models, capsys):
    assert cli.main(["model", "export", "--out", str(tmp_path / "x.gguf"), "--from", str(tmp_path)]) == 2
    assert cli.main(["model", "export", "--out", str(tmp_path), "--from", str(models.target)]) == 2
    err = capsys.readouterr().err
    assert "not a model directory (missing config.json" in err and "is a directory; want a FILE.gguf" in err
    assert "Traceback" not in err
