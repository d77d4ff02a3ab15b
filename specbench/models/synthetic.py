"""Random-weight models at real shapes, built from a config alone (no download).

Names follow ``<shape>[-tiny][-<precision>]``, e.g. ``qwen3-8b-4bit``, ``qwen3-30b-a3b-4bit``,
``qwen3.5-9b-bf16``, ``qwen3-8b-tiny``. Full shapes default to bfloat16, tiny ones (for CPU tests)
to float32. Quantization follows ``mlx_lm.convert``: affine, group size 64, every layer with a
``to_quantized`` whose input width divides by the group size, and the model's own
``quant_predicate`` (MoE routers at 8 bits), as mlx-community's releases are made.

The Qwen3.5-like shapes are hybrids (Gated DeltaNet layers with full attention every fourth
layer; mlx-lm model types ``qwen3_5`` and ``qwen3_5_moe``) sized like Qwen3.5-9B and
Qwen3.5-35B-A3B; ``mtp=True`` attaches a random multi-token-prediction head to them.

Miniatures (``load("tiny:NAME")``, ``tiny_model``) take a model folder's architecture and tokenizer at the tiny
dimensions, for checking a pipeline in seconds.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map, tree_map_with_path
from mlx_lm.utils import _get_classes, load_config, load_tokenizer

from specbench.models.mtp.head import build_head, quantize_like_body

PREFIX = "synthetic:"
TINY_PREFIX = "tiny:"
GROUP_SIZE = 64

#: What the Qwen3 shapes share.
_QWEN3 = {
    "num_attention_heads": 32,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
}

#: What the text models of the Qwen3.5 shapes share.
_QWEN35_TEXT = {
    "num_attention_heads": 16,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10_000_000,
        "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10],
    },
    "tie_word_embeddings": False,
    "vocab_size": 248320,
    "mtp_num_hidden_layers": 1,
}

#: Hugging Face style configs (what ``config.json`` holds) of the full-size shapes.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-8b": {
        "model_type": "qwen3",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        **_QWEN3,
    },
    "qwen3-30b-a3b": {
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        **_QWEN3,
    },
    # SmolLM2-135M's layers with an MoE MLP: 16 experts of width 192, top-4 (a token's experts add up to half
    # SmolLM2's MLP width): an MoE small enough for a CPU (use -fp32 there: gather_mm on the CPU is float32 only).
    "smollm2-135m-16e": {
        "model_type": "qwen3_moe",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 192,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "tie_word_embeddings": True,
        "vocab_size": 49152,
    },
    "qwen3.5-9b": {
        "model_type": "qwen3_5",
        "text_config": {
            "model_type": "qwen3_5_text",
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 32,
            "num_key_value_heads": 4,
            **_QWEN35_TEXT,
        },
    },
    "qwen3.5-35b-a3b": {
        "model_type": "qwen3_5_moe",
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "hidden_size": 2048,
            "intermediate_size": 512,
            "num_hidden_layers": 40,
            "num_key_value_heads": 2,
            "num_experts": 256,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "norm_topk_prob": True,
            **_QWEN35_TEXT,
        },
    },
}

#: Dimensions of a miniature and of the "-tiny" shapes: the model's architecture and vocabulary, these sizes.
TINY_DIMS = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
}
TINY_EXPERTS = {"num_experts": 8, "num_experts_per_tok": 2, "n_routed_experts": 8}
#: What turns a full shape into its tiny CPU-test version (same architecture): ``tiny_config``, then these.
_TINY_VOCAB = 512
_TINY_LINEAR = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
}

_PRECISIONS = {
    "bf16": (mx.bfloat16, None),
    "fp16": (mx.float16, None),
    "fp32": (mx.float32, None),
    **{f"{bits}bit": (mx.bfloat16, bits) for bits in (3, 4, 5, 6, 8)},
}
_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_NAME = re.compile(r"^(?P<shape>.+?)(?P<tiny>-tiny)?(?:-(?P<precision>bf16|fp16|fp32|\d+bit))?$")


def parse(name: str) -> tuple[str, bool, str | None]:
    """Split a synthetic model name into (shape, tiny, precision or None)."""
    bare = name[len(PREFIX) :] if name.startswith(PREFIX) else name
    m = _NAME.match(bare.lower())
    shape, tiny, precision = m["shape"], bool(m["tiny"]), m["precision"]
    if shape not in SHAPES or (precision is not None and precision not in _PRECISIONS):
        raise ValueError(
            f"unknown synthetic model {name!r}: shapes are {', '.join(SHAPES)}, optionally with "
            f"'-tiny' and a precision suffix ({', '.join(_PRECISIONS)}), e.g. 'qwen3-8b-4bit'"
        )
    return shape, tiny, precision


def tiny_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` shrunk to ``TINY_DIMS`` (keys it has), vocabulary and architecture kept."""
    config = dict(config)
    text = dict(config.get("text_config", config))
    for key, value in TINY_DIMS.items():
        if key in text or key in ("hidden_size", "num_hidden_layers"):
            text[key] = value
    for key, value in TINY_EXPERTS.items():
        if key in text:
            text[key] = min(int(text[key]), value)
    interval = text.get("full_attention_interval")
    if interval:
        text["num_hidden_layers"] = max(int(interval), text["num_hidden_layers"])
    if "text_config" in config:
        config["text_config"] = text
        return config
    return text


def tiny_model(folder: str | Path, seed: int = 0, scale: float = 2.0) -> tuple[Any, Any]:
    """A random-weight float32 miniature of the mlx-lm model folder ``folder``, with its real tokenizer.

    2-D weights are scaled by ``scale``: at the default initialisation greedy decoding repeats
    one token (every draft accepted), at 3 and above it never repeats (none drafted); at 2 the
    output mixes both, so drafts are accepted in part, as with a real model.
    """
    config = load_config(Path(folder))
    model = from_config(tiny_config(config), seed)
    model.update(tree_map(lambda p: (p * scale if p.ndim == 2 else p).astype(mx.float32), model.parameters()))
    eos = config.get("eos_token_id")
    return ready(model), load_tokenizer(Path(folder), eos_token_ids=[eos] if isinstance(eos, int) else eos)


def config(name: str, layers: int | None = None) -> dict:
    """The Hugging Face style config of a synthetic shape (``layers`` overrides the depth)."""
    shape, tiny, _ = parse(name)
    cfg = tiny_config(copy.deepcopy(SHAPES[shape])) if tiny else copy.deepcopy(SHAPES[shape])
    text = cfg.get("text_config", cfg)
    if tiny:
        text.update(vocab_size=_TINY_VOCAB, **{k: v for k, v in _TINY_LINEAR.items() if k in text})
    if layers is not None:
        interval = text.get("full_attention_interval", 1)
        if layers < interval:
            raise ValueError(
                f"{shape} needs layers >= {interval} (one full-attention layer every {interval}); got layers={layers}"
            )
        text["num_hidden_layers"] = int(layers)
    return cfg


def as_dtype(dtype: mx.Dtype | str | None) -> mx.Dtype | None:
    """An mx.Dtype (None as it is) from one or its name: bfloat16, float16, float32 (or bf16, fp16, fp32)."""
    if dtype is None or isinstance(dtype, mx.Dtype):
        return dtype
    name = str(dtype).removeprefix("mlx.core.")
    key = _DTYPE_NAMES.get(name, name)
    if key not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"dtype must be bfloat16, float16 or float32 (or an mx.Dtype), got {dtype!r}")
    return _PRECISIONS[key][0]


def build(
    name: str,
    layers: int | None = None,
    dtype: mx.Dtype | str | None = None,
    bits: int | None = None,
    group_size: int = GROUP_SIZE,
    seed: int = 0,
    mtp: bool = False,
) -> nn.Module:
    """Build a random-weight mlx-lm model of a named shape.

    ``dtype`` is the dtype of unquantized weights (and of the quantization scales); ``bits``
    quantizes (overriding the name's precision; ``bits=0`` means unquantized). ``mtp`` attaches a
    random multi-token-prediction head to the shapes that have one (Qwen3.5).
    """
    shape, tiny, precision = parse(name)
    name_dtype, name_bits = _PRECISIONS[precision or ("fp32" if tiny else "bf16")]
    dtype = as_dtype(dtype) or name_dtype
    bits = name_bits if bits is None else (bits or None)
    cfg = config(name, layers)
    model = build_from_config(cfg, dtype=dtype, bits=bits, group_size=group_size, seed=seed)
    if mtp:
        if not cfg.get("text_config", cfg).get("mtp_num_hidden_layers", 0):
            raise ValueError(f"{cfg['model_type']} has no MTP head; build it with mtp=False")
        mx.random.seed(seed)
        head = build_head(model)  # random weights, cast and quantized like the body
        cast_dtype(head, dtype)
        quantize_like_body(model, head)
        model.mtp = ready(head)
    suffix = f"{bits}bit" if bits else _DTYPE_NAMES[str(dtype).split(".")[-1]]
    depth = f"-{layers}l" if layers is not None else ""
    model.specbench_name = f"{PREFIX}{shape}{'-tiny' if tiny else ''}-{suffix}{depth}"
    return model


def build_from_config(
    cfg: dict,
    dtype: mx.Dtype = mx.bfloat16,
    bits: int | None = None,
    group_size: int = GROUP_SIZE,
    seed: int = 0,
) -> nn.Module:
    """Build a random-weight model from a Hugging Face style config dict (any mlx-lm model_type)."""
    model = from_config(cfg, seed)
    cast_dtype(model, dtype)
    if bits:
        _quantize(model, bits, group_size)
    # Materialise layer by layer: the float32 draws of one layer are freed before the next.
    for layer in model.layers:
        mx.eval(layer.parameters())
    return ready(model)


def from_config(cfg: dict[str, Any], seed: int | None = None) -> nn.Module:
    """The mlx-lm model of a Hugging Face style config, its weights as initialised (drawn after ``seed``), lazy."""
    model_class, args_class = _get_classes(cfg)
    if seed is not None:
        mx.random.seed(seed)
    return model_class(args_class.from_dict(cfg))


def ready(model: nn.Module) -> nn.Module:
    """``model`` with its parameters evaluated, in eval mode."""
    mx.eval(model.parameters())
    model.eval()
    return model


def cast_dtype(model: nn.Module, dtype: mx.Dtype) -> None:
    """Cast the model's floating-point parameters to ``dtype`` in place, lazily, but those its ``cast_predicate``
    keeps (mlx-lm keeps Gated DeltaNet's A_log in float32)."""
    keep = getattr(model, "cast_predicate", None) or (lambda path: True)
    model.update(
        tree_map_with_path(
            lambda path, v: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) and keep(path) else v,
            model.parameters(),
        )
    )


def _quantize(model: nn.Module, bits: int, group_size: int) -> None:
    model_predicate = getattr(model, "quant_predicate", None)

    def predicate(path: str, module: nn.Module) -> bool | dict:
        if not hasattr(module, "to_quantized") or module.weight.shape[-1] % group_size:
            return False
        return model_predicate(path, module) if model_predicate else True

    nn.quantize(model, group_size, bits, class_predicate=predicate)


def parameter_count(name: str, layers: int | None = None) -> int:
    """Parameters of a shape before quantization, counted from the module tree (nothing is drawn)."""
    return sum(v.size for _, v in tree_flatten(from_config(config(name, layers)).parameters()))


def parameter_bytes(model: nn.Module) -> int:
    """Bytes held by the model's parameters (weights, scales and biases)."""
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))
