"""`coopsched model build`: tiny seeded llama models that `mlx_lm.load` reads fully offline.

A target is seeded float32 weights plus a byte-level BPE trained on the in-repo corpus; a
drafter is a target plus seeded weight noise. Same arguments -> the same bytes. `ensure_tiny_models`
builds a pair once into a cache; `model export` writes one as GGUF (gguf_export.py).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

BUILD_VERSION = 1  # bump when the files a build writes change, so caches rebuild
CORPUS = Path(__file__).with_name("corpus.txt")
EOS_TOKEN = "<|endoftext|>"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
REQUIRED_FILES = ("config.json", "model.safetensors", *TOKENIZER_FILES)

# size -> llama dims; ~0.46 M, ~3.4 M and ~14 M parameters with a 512-token vocab
SIZES = {
    "s": dict(hidden_size=128, num_hidden_layers=2, intermediate_size=256, num_attention_heads=4),
    "m": dict(hidden_size=256, num_hidden_layers=4, intermediate_size=688, num_attention_heads=4),
    "l": dict(hidden_size=384, num_hidden_layers=8, intermediate_size=1024, num_attention_heads=6),
}
VOCAB_SIZE = 512
DEFAULT_NOISE = 0.05


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "coopsched" / "models"


# -- tokenizer ------------------------------------------------------------------
def build_tokenizer(vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE trained on the corpus, padded with unused specials to `vocab_size` ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(CORPUS.read_text().splitlines(), trainer)
    missing = vocab_size - tokenizer.get_vocab_size()
    if missing < 0:
        raise RuntimeError(f"tokenizer has {tokenizer.get_vocab_size()} ids, more than {vocab_size}")
    tokenizer.add_special_tokens([f"<|unused_{i}|>" for i in range(missing)])
    return tokenizer


def suppressed_ids(tokenizer) -> list[int]:
    """Specials and tokens that are not a printable UTF-8 chunk on their own."""
    specials = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
    out = []
    for token_id in range(tokenizer.get_vocab_size()):
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        if tokenizer.id_to_token(token_id) in specials or not text or "\ufffd" in text \
                or not text.isprintable():
            out.append(token_id)
    return out


def _write_tokenizer(tokenizer, out: Path) -> None:
    tokenizer.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS_TOKEN,
              "add_bos_token": False, "clean_up_tokenization_spaces": False,
              "model_max_length": 4096}
    _write_json(out / "tokenizer_config.json", config)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# -- weights --------------------------------------------------------------------
def _model_config(size: int | str, eos_id: int, seed: int) -> dict:
    if size not in SIZES:
        raise ValueError(f"size={size!r} is not one of {', '.join(SIZES)}")
    return {"model_type": "llama", "vocab_size": VOCAB_SIZE, "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False, "max_position_embeddings": 4096,
            "rope_theta": 10000.0, "eos_token_id": eos_id, "torch_dtype": "float32",
            **SIZES[size], "coopsched": {"build_version": BUILD_VERSION, "size": size, "seed": seed}}


def _save_weights(weights: dict, out: Path) -> None:
    import mlx.core as mx

    mx.save_safetensors(str(out / "model.safetensors"), dict(sorted(weights.items())),
                        metadata={"format": "mlx"})


def build_target(out: str | Path, seed: int = 0, size: str = "s", progress=None) -> Path:
    """Write a seeded tiny target model into `out` (created); return the path."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.llama import Model, ModelArgs

    out = _fresh_dir(out)
    step = progress or (lambda _msg: None)
    step("training the tokenizer")
    tokenizer = build_tokenizer()
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    config = _model_config(size, eos_id, seed)
    step(f"drawing size-{size} weights (seed {seed})")
    mx.random.seed(seed)
    args = ModelArgs.from_dict({k: v for k, v in config.items() if k != "coopsched"})
    model = Model(args)
    # Suppressed rows get logit 0; printable rows win greedy decoding (their max is > 0).
    head = model.lm_head.weight
    keep = mx.ones((VOCAB_SIZE, 1), dtype=head.dtype)
    keep[mx.array(suppressed_ids(tokenizer))] = 0
    model.lm_head.weight = head * keep
    weights = dict(tree_flatten(model.parameters()))
    step("writing files")
    _save_weights(weights, out)
    _write_json(out / "config.json", config)
    _write_tokenizer(tokenizer, out)
    return out


def build_drafter(out: str | Path, target_dir: str | Path, noise: float = DEFAULT_NOISE,
                  seed: int = 0, progress=None) -> Path:
    """The target plus seeded Gaussian noise scaled by each tensor's RMS (suppressed rows stay 0)."""
    import mlx.core as mx

    if noise < 0:
        raise ValueError(f"--noise {noise}: the noise scale must be >= 0")
    target_dir = Path(target_dir).resolve()
    missing = [f for f in REQUIRED_FILES if not (target_dir / f).is_file()]
    if missing:
        raise FileNotFoundError(f"--from {target_dir}: not a model directory (missing {', '.join(missing)})")
    out = _fresh_dir(out)
    step = progress or (lambda _msg: None)
    step(f"adding noise {noise} to {target_dir.name} (seed {seed})")
    weights = mx.load(str(target_dir / "model.safetensors"))
    key = mx.random.key(seed)
    noisy = {}
    for name in sorted(weights):
        key, sub = mx.random.split(key)
        w = weights[name]
        rms = mx.sqrt(mx.mean(w * w))
        noisy[name] = w + noise * rms * mx.random.normal(w.shape, dtype=w.dtype, key=sub)
    zero_rows = mx.all(weights["lm_head.weight"] == 0, axis=1, keepdims=True)
    noisy["lm_head.weight"] = mx.where(zero_rows, 0.0, noisy["lm_head.weight"])
    step("writing files")
    _save_weights(noisy, out)
    config = json.loads((target_dir / "config.json").read_text())
    config["coopsched"] = {**config.get("coopsched", {}), "drafter_noise": noise, "drafter_seed": seed}
    _write_json(out / "config.json", config)
    for name in TOKENIZER_FILES:
        shutil.copyfile(target_dir / name, out / name)
    return out


def _fresh_dir(out: str | Path) -> Path:
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()):
        stale = [f for f in out.iterdir() if f.name not in REQUIRED_FILES]
        if stale:
            raise FileExistsError(f"--out {out} exists and holds other files ({stale[0].name}); "
                                  "pick an empty or new directory")
    out.mkdir(parents=True, exist_ok=True)
    return out


# -- cache ----------------------------------------------------------------------
def is_model_dir(path: Path) -> bool:
    return all((path / f).is_file() for f in REQUIRED_FILES)


def ensure_tiny_models(cache_dir: str | Path | None = None, size: str = "s", seed: int = 0,
                       noise: float = DEFAULT_NOISE, progress=None) -> tuple[Path, Path]:
    """(target_dir, draft_dir) under `cache_dir`, built once (atomically) and then reused."""
    root = Path(cache_dir or default_cache_dir()).resolve()
    target = root / f"v{BUILD_VERSION}-{size}-seed{seed}"
    draft = root / f"v{BUILD_VERSION}-{size}-seed{seed}-draft-noise{noise:g}-seed{seed}"
    _build_once(target, lambda tmp: build_target(tmp, seed, size, progress))
    _build_once(draft, lambda tmp: build_drafter(tmp, target, noise, seed, progress))
    return target, draft


def _build_once(path: Path, build) -> None:
    if is_model_dir(path):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
    try:
        build(tmp)
        if is_model_dir(path):  # another process won the race with the same bytes
            return
        if path.exists():  # incomplete: not from a rename, so nobody is reading it
            shutil.rmtree(path)
        tmp.rename(path)
    except OSError:
        if not is_model_dir(path):  # not a lost race with another builder
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- command line -------------------------------------------------------------
def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    build = sub.add_parser("build", help="build a tiny seeded target (or, with --from, a drafter)")
    build.add_argument("--out", required=True, help="directory to write (created)")
    build.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    build.add_argument("--size", choices=sorted(SIZES), default="s",
                       help="s ~0.5 M, m ~3.4 M, l ~14 M parameters (default s)")
    build.add_argument("--from", dest="from_dir", metavar="TARGET_DIR",
                       help="build a drafter: this target plus seeded weight noise")
    build.add_argument("--noise", type=float, default=None,
                       help=f"drafter noise scale, relative to each tensor's RMS (default {DEFAULT_NOISE})")
    export = sub.add_parser("export", help="write a model directory as a llama.cpp GGUF file")
    export.add_argument("--format", choices=("gguf",), default="gguf", help="file format (gguf)")
    export.add_argument("--out", required=True, metavar="FILE.gguf", help="file to write")
    export.add_argument("--from", dest="from_dir", metavar="MODEL_DIR",
                        help="the model to export (default: the tiny target `model build` makes, built once)")


def main(args) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    if args.model_command == "export":
        return _export(args, console)
    if args.noise is not None and args.from_dir is None:
        console.print("[red]error:[/red] --noise needs --from TARGET_DIR (a drafter is a target plus noise)",
                      soft_wrap=True)
        return 2
    with console.status("building") as status:
        def progress(message: str) -> None:
            status.update(message)
            console.print(f"  {message}", highlight=False)
        try:
            if args.from_dir:
                out = build_drafter(args.out, args.from_dir,
                                    DEFAULT_NOISE if args.noise is None else args.noise,
                                    args.seed, progress)
            else:
                out = build_target(args.out, args.seed, args.size, progress)
        except (ValueError, FileNotFoundError, FileExistsError) as exc:
            console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
            return 2
    console.print(f"wrote {out}")
    return 0


def _export(args, console) -> int:
    try:
        from coopsched.backends.gguf_export import export_gguf

        with console.status("exporting") as status:
            def progress(message: str) -> None:
                status.update(message)
                console.print(f"  {message}", highlight=False)
            model_dir = Path(args.from_dir) if args.from_dir else ensure_tiny_models(progress=progress)[0]
            out = export_gguf(model_dir, args.out, progress)
    except ImportError as exc:  # gguf/safetensors to export; mlx to build the default model first
        console.print(f"[red]error:[/red] model export needs the {exc.name} package: pip install -e "
                      f"'.[gguf{'' if args.from_dir else ',mlx'}]'", soft_wrap=True)
        return 2
    except (ValueError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)
        return 2
    console.print(f"wrote {out}")
    return 0

