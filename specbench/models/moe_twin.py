"""MoE twins of dense models: the same function computed by a mixture of identical experts.

A dense llama-architecture model becomes a ``mixtral`` checkpoint (which mlx-lm loads) whose
``num_experts`` experts are copies of each layer's MLP, routed top-``top_k`` by a random router.
The routed experts' outputs are combined with softmax weights that sum to one, so the twin
computes the dense model's function (up to float rounding) and accepts the same drafts; only
its cost pattern differs: a verification of w tokens reads the weights of every expert its rows
route to, as in a real MoE model. The twin of an MTP head is made the same way.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.utils import _get_classes, save_model

from specbench.common.files import write_json_atomic, write_safetensors_atomic
from specbench.models.embedded import COMPLETE_MARKER

NUM_EXPERTS = 8
TOP_K = 2


def twin_config(dense: dict[str, Any], num_experts: int = NUM_EXPERTS, top_k: int = TOP_K) -> dict[str, Any]:
    """The mixtral config of a dense llama config."""
    if dense.get("model_type") not in ("llama", "mistral"):
        raise ValueError(f"an MoE twin is built from a llama or mistral model, not {dense.get('model_type')!r}")
    heads = dense["num_attention_heads"]
    if dense.get("head_dim") not in (None, dense["hidden_size"] // heads):
        raise ValueError("the twin (mixtral) needs head_dim == hidden_size / num_attention_heads")
    for key in ("attention_bias", "mlp_bias"):
        if dense.get(key):
            raise ValueError(f"the twin (mixtral) has no {key.replace('_', ' ')}; this model uses one")
    if dense.get("rope_scaling"):
        raise ValueError("the twin (mixtral) uses plain RoPE; this model scales it (rope_scaling)")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"need 1 <= top_k <= num_experts, got top_k={top_k}, num_experts={num_experts}")
    keep = (
        "hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads rms_norm_eps "
        "vocab_size rope_theta tie_word_embeddings max_position_embeddings bos_token_id eos_token_id pad_token_id "
        "torch_dtype"
    ).split()
    config = {k: dense[k] for k in keep if k in dense}
    config.update(
        model_type="mixtral",
        architectures=["MixtralForCausalLM"],
        num_local_experts=num_experts,
        num_experts_per_tok=top_k,
        rope_traditional=bool(dense.get("rope_traditional", False)),
    )
    config.setdefault("num_key_value_heads", heads)
    config.setdefault("rope_theta", 10000.0)
    return config


def expand_mlp(tensors: dict[str, mx.array], num_experts: int = NUM_EXPERTS, seed: int = 0) -> dict[str, mx.array]:
    """Replace every ``<prefix>.mlp.{gate,up,down}_proj.weight`` by ``num_experts`` stacked copies
    (``<prefix>.block_sparse_moe.switch_mlp.*``) and a random router (``<prefix>.block_sparse_moe.gate.weight``)."""
    out: dict[str, mx.array] = {}
    key = mx.random.key(seed)
    for name, value in tensors.items():
        m = re.match(r"(.*)\.mlp\.(gate_proj|up_proj|down_proj)\.weight$", name)
        if not m:
            out[name] = value
            continue
        out[f"{m[1]}.block_sparse_moe.switch_mlp.{m[2]}.weight"] = mx.repeat(value[None], num_experts, axis=0)
        if m[2] == "gate_proj":
            key, sub = mx.random.split(key)
            router = mx.random.normal((num_experts, value.shape[1]), key=sub) * value.shape[1] ** -0.5
            out[f"{m[1]}.block_sparse_moe.gate.weight"] = router.astype(value.dtype)
    return out


def build_twin(
    dense_folder: Path, out_dir: Path, num_experts: int = NUM_EXPERTS, top_k: int = TOP_K, seed: int = 0
) -> dict[str, Any]:
    """Write the MoE twin of the mlx-lm folder ``dense_folder`` into the existing folder ``out_dir``."""
    dense_folder, out_dir = Path(dense_folder), Path(out_dir)
    config = twin_config(json.loads((dense_folder / "config.json").read_text()), num_experts, top_k)
    files = [f for f in sorted(dense_folder.glob("*.safetensors")) if f.name != "mtp.safetensors"]
    if not files:
        raise FileNotFoundError(f"{dense_folder} holds no model weights (*.safetensors)")
    weights: dict[str, mx.array] = {}
    for f in files:
        weights.update(mx.load(str(f)))
    save_model(out_dir, twin_model(config, weights, seed))
    write_json_atomic(out_dir / "config.json", config)
    # the tokenizer's and generation's files (the weights, config and build marker are the twin's own)
    for path in dense_folder.iterdir():
        own = path.suffix == ".safetensors" or path.name == COMPLETE_MARKER or (out_dir / path.name).exists()
        if path.is_file() and not own:
            shutil.copy(path, out_dir / path.name)
    return {"dense": str(dense_folder), "num_experts": num_experts, "top_k": top_k, "seed": seed}


def twin_model(config: dict[str, Any], dense_weights: dict[str, mx.array], seed: int) -> nn.Module:
    """The twin model of mixtral ``config`` holding the dense model's weights, its MLPs expanded."""
    model_class, args_class = _get_classes(config)
    twin = model_class(args_class.from_dict(config))
    weights = expand_mlp(dense_weights, config["num_local_experts"], seed)
    twin.load_weights([(k, v) for k, v in weights.items() if not k.startswith("mtp.")])
    return twin


def twin_head_file(dense_head: Path, out: Path, num_experts: int = NUM_EXPERTS, seed: int = 0) -> Path:
    """Write the twin of a saved dense MTP head (``mtp.*`` tensors of a llama-layer head)."""
    tensors, metadata = mx.load(str(dense_head), return_metadata=True)
    twin = expand_mlp(tensors, num_experts, seed + 1)
    if "config" in metadata:
        metadata["config"] = json.dumps({**json.loads(metadata["config"]), "model_type": "mixtral"})
    return write_safetensors_atomic(out, twin, metadata)
