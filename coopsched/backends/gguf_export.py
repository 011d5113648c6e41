"""`coopsched model export --format gguf`: a model directory (`model build`'s) as a llama GGUF.

Written with the `gguf` package's GGUFWriter, as llama.cpp's own converter would write it:
llama architecture, float32 tensors, Q and K rows permuted for llama.cpp's rotary layout, and
the byte-level BPE of tokenizer.json as a `gpt2` tokenizer (EOS from config.json, no BOS).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# llama.cpp applies the rotary embedding to interleaved pairs, the HF/mlx-lm llama to the two
# halves of each head: its converter permutes Q and K rows so both compute the same thing
PERMUTED = (".self_attn.q_proj.weight", ".self_attn.k_proj.weight")
PRE_TOKENIZER = "gpt-2"  # llama.cpp's name for the GPT-2 split regex, which ByteLevel(use_regex) uses


def permute_for_rope(weights: np.ndarray, num_heads: int) -> np.ndarray:
    """Rows of each head reordered from halves (x0..x63, y0..y63) to pairs (x0, y0, x1, y1, ...)."""
    rows = weights.shape[0]
    return (weights.reshape(num_heads, 2, rows // num_heads // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def vocabulary(tokenizer_json: dict) -> tuple[list[str], list[int], list[str]]:
    """(tokens by id, their GGUF token types, merges as "a b") of a tokenizers BPE."""
    from gguf import TokenType

    model = tokenizer_json["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"tokenizer.json: model type {model.get('type')!r}; only a BPE converts to gpt2")
    by_id = {int(i): token for token, i in model["vocab"].items()}
    special = set()
    for added in tokenizer_json.get("added_tokens", []):
        by_id[int(added["id"])] = added["content"]
        if added.get("special"):
            special.add(int(added["id"]))
    size = max(by_id) + 1
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(size)]
    types = [int(TokenType.CONTROL if i in special else TokenType.NORMAL if i in by_id else TokenType.UNUSED)
             for i in range(size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges


def _check_model_dir(model_dir: Path) -> dict:
    missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json") if not (model_dir / f).is_file()]
    if missing:
        raise FileNotFoundError(f"--from {model_dir}: not a model directory (missing {', '.join(missing)})")
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise ValueError(f"--from {model_dir}/config.json: model_type {config.get('model_type')!r}; "
                         "only llama exports")
    return config


def export_gguf(model_dir: str | Path, out: str | Path, progress=None) -> Path:
    """Write `model_dir` (config.json, model.safetensors, tokenizer.json) as a GGUF file at `out`."""
    import gguf
    from safetensors.numpy import load_file

    model_dir, out = Path(model_dir).resolve(), Path(out).resolve()
    if out.is_dir():
        raise IsADirectoryError(f"--out {out} is a directory; want a FILE.gguf path")
    config = _check_model_dir(model_dir)
    step = progress or (lambda _msg: None)
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    layers = int(config["num_hidden_layers"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    tokens, types, merges = vocabulary(json.loads((model_dir / "tokenizer.json").read_text()))
    if len(tokens) != config["vocab_size"]:
        raise ValueError(f"--from {model_dir}: tokenizer.json has {len(tokens)} tokens, config.json's "
                         f"vocab_size is {config['vocab_size']}; they must match")

    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    writer.add_name(model_dir.name)
    writer.add_context_length(int(config.get("max_position_embeddings", 4096)))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_block_count(layers)
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-5)))
    writer.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(PRE_TOKENIZER)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(int(config["eos_token_id"]))
    writer.add_add_bos_token(False)
    writer.add_add_eos_token(False)

    step(f"converting {layers} layers to float32")
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, layers)
    for name, weights in sorted(load_file(str(model_dir / "model.safetensors")).items()):
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"--from {model_dir}/model.safetensors: tensor {name!r} has no llama GGUF name")
        weights = weights.astype(np.float32)
        if name.endswith(PERMUTED):
            weights = permute_for_rope(weights, heads if name.endswith(PERMUTED[0]) else kv_heads)
        writer.add_tensor(gguf_name, weights)
    step(f"writing {out.name}")
    out.parent.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
