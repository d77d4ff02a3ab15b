"""The MTP head module and how to build one for a given mlx-lm model.

One head serves every checkpoint family: the next token's embedding and the model's hidden state
(post final norm) are normalised, concatenated and projected back to the hidden size (``fc``),
run through decoder layers of the model's own architecture with their own KV cache, and
normalised (``norm``) for the model's lm_head. Families differ only in the concatenation order
(MiMo puts the hidden state first) and in which state chains into the next draft step (DeepSeek
chains the state before ``norm``). Parameter names follow Qwen3.5's ``mtp.*`` tensors.
"""

from __future__ import annotations

import inspect
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from specbench.core.forward import text_model
from specbench.models.mtp.layouts import QWEN, Layout

#: Model types whose decoder layers take a boolean mask array rather than "causal".
_ARRAY_MASK_TYPES = {"deepseek_v3", "deepseek_v32", "kimi_k2"}


class MtpModule(nn.Module):
    """fc(concat(norm_e(embed(token)), norm_h(hidden))) -> decoder layers -> norm."""

    def __init__(
        self,
        hidden_size: int,
        eps: float,
        layers: list[nn.Module],
        hidden_first: bool = False,
        chain_normed: bool = True,
        array_mask: bool = False,
    ):
        super().__init__()
        self.pre_fc_norm_embedding = nn.RMSNorm(hidden_size, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(hidden_size, eps=eps)
        self.fc = nn.Linear(2 * hidden_size, hidden_size, bias=False)
        self.layers = layers
        self.norm = nn.RMSNorm(hidden_size, eps=eps)
        self.hidden_first = hidden_first
        self.chain_normed = chain_normed
        self.array_mask = array_mask

    def __call__(
        self, embeddings: mx.array, hidden: mx.array, cache: list[Any] | None = None
    ) -> tuple[mx.array, mx.array]:
        """Run pairs (embedding of token i+1, hidden state at i) -> (chained state, post-norm state).

        The post-norm state goes to the model's lm_head; the chained state is the hidden input
        of the next draft step.
        """
        e = self.pre_fc_norm_embedding(embeddings)
        h = self.pre_fc_norm_hidden(hidden)
        x = self.fc(mx.concatenate([h, e] if self.hidden_first else [e, h], axis=-1))
        if cache is None:
            cache = [None] * len(self.layers)
        mask = create_attention_mask(x, cache[0], return_array=self.array_mask)
        for layer, c in zip(self.layers, cache):
            x = layer(x, mask, c)
        out = self.norm(x)
        return (out if self.chain_normed else x), out

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]


def model_type(model: nn.Module) -> str:
    """The model's type, without the ``_text`` suffix of multimodal wrappers' text configs."""
    lm = text_model(model)
    name = getattr(model, "model_type", None) or getattr(lm, "model_type", None) or getattr(lm.args, "model_type", "")
    return str(name).removesuffix("_text")


def model_args(model: nn.Module) -> Any:
    return text_model(model).args


def body_layers(model: nn.Module) -> list[nn.Module]:
    return list(text_model(model).model.layers)


def decoder_layer(model: nn.Module) -> nn.Module:
    """A fresh decoder layer of the model's own class, built from its config as the head's layer: a full-attention
    layer of a hybrid model, else the layer after the body (DeepSeek, GLM); the index picks attention and MLP kind."""
    layers = body_layers(model)
    if not layers:
        raise ValueError("the model has no decoder layers")
    cls = type(layers[-1])
    args = model_args(model)
    interval = getattr(args, "full_attention_interval", None)
    idx = int(interval) - 1 if interval else int(args.num_hidden_layers)
    params = inspect.signature(cls.__init__).parameters
    if "layer_idx" in params:
        return cls(args, layer_idx=idx)
    if "layer_id" in params:
        return cls(args, layer_id=idx)
    return cls(args)


def build_head(model: nn.Module, depth: int = 1, layout: Layout = QWEN) -> MtpModule:
    """An MTP head with random weights shaped for ``model`` (``depth`` decoder layers), run as ``layout``'s are."""
    args = model_args(model)
    return MtpModule(
        int(args.hidden_size),
        float(getattr(args, "rms_norm_eps", 1e-6)),
        [decoder_layer(model) for _ in range(depth)],
        hidden_first=layout.hidden_first,
        chain_normed=layout.chain_normed,
        array_mask=model_type(model) in _ARRAY_MASK_TYPES,
    )


def float_dtype(model: nn.Module) -> mx.Dtype:
    """The dtype of the model's unquantized weights (its final norm's)."""
    return text_model(model).model.norm.weight.dtype


def _structure(module: nn.Module) -> set[str]:
    """Parameter names without quantization's scales/biases (so quantized and float layers compare)."""
    return {k for k, _ in tree_flatten(module.parameters()) if not k.endswith((".scales", ".biases"))}


def template_layer(model: nn.Module, layer: nn.Module) -> nn.Module | None:
    """The body layer with the same structure as ``layer`` (whose quantization the head copies)."""
    want = _structure(layer)
    for body_layer in reversed(body_layers(model)):
        if _structure(body_layer) == want:
            return body_layer
    return None


def _quantization(module: nn.Module) -> dict | None:
    bits = getattr(module, "bits", None)
    if bits is None or not hasattr(module, "scales"):
        return None
    return {"bits": int(bits), "group_size": int(module.group_size), "mode": getattr(module, "mode", "affine")}


def quantize_like_body(model: nn.Module, head: MtpModule) -> None:
    """Quantize the head's layers as the body's matching layers are (bits, group size, mode).

    Each decoder-layer module copies its counterpart in a body layer of the same structure, so a
    router kept at 8 bits stays at 8 bits; ``fc`` takes the body's most common setting.
    """
    settings: dict[tuple, int] = {}
    for _, m in text_model(model).named_modules():
        q = _quantization(m)
        if q is not None and m.weight.ndim == 2:
            key = tuple(sorted(q.items()))
            settings[key] = settings.get(key, 0) + int(m.weight.size)
    if not settings:
        return
    common = dict(max(settings, key=settings.get))
    templates = [template_layer(model, layer) for layer in head.layers]
    body_modules = [dict(t.named_modules()) if t is not None else {} for t in templates]

    def predicate(path: str, module: nn.Module) -> bool | dict:
        if not hasattr(module, "to_quantized"):
            return False
        if path.startswith("layers."):
            i, _, rest = path[len("layers.") :].partition(".")
            twin = body_modules[int(i)].get(rest)
            if twin is not None:
                return _quantization(twin) or False
        return False if module.weight.shape[-1] % common["group_size"] else dict(common)

    nn.quantize(head, class_predicate=predicate)
