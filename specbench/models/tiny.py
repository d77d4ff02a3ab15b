"""Miniatures: a model's architecture and tokenizer at tiny random-weight dimensions, for checking a
pipeline in seconds (``load("tiny:NAME")``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.utils import _get_classes, load_config, load_tokenizer

PREFIX = "tiny:"

#: Dimensions of a miniature (and of synthetic "-tiny" shapes): the model's architecture and tokenizer, these sizes.
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
    folder = Path(folder)
    config = load_config(folder)
    small = tiny_config(config)
    model_class, args_class = _get_classes(small)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(small))
    model.update(tree_map(lambda p: (p * scale if p.ndim == 2 else p).astype(mx.float32), model.parameters()))
    mx.eval(model.parameters())
    model.eval()
    eos = config.get("eos_token_id")
    tokenizer = load_tokenizer(folder, eos_token_ids=[eos] if isinstance(eos, int) else eos)
    return model, tokenizer
