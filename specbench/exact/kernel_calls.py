"""The split's calls through the row-invariant kernels (``specbench.kernels``), where the device's probe proved them.

A linear layer (``linear/kernel``): quantized through ``qmv_rows``, dense through ``gemv_rows``, every row as MLX's
one-row product, in one call. Causal attention (``attention/kernel``): every row in one ``attention_rows`` call, as
the one-query call computes it. Each answers None where it does not apply, and the split (``specbench.exact.hooks``)
then runs the rows through the layer's own calls.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specbench import kernels
from specbench.exact.plan import ExactPlan


def kernel_product(layer: nn.Module, x: mx.array) -> mx.array | None:
    """``layer(x)`` through a row-invariant kernel, every row as MLX's one-row product: a
    ``QuantizedLinear`` (or a ``QuantizedEmbedding``'s ``as_linear``) through ``kernels.qmv_rows``, a
    ``Linear`` (or an ``Embedding``'s ``as_linear``) through ``kernels.gemv_rows``. None where no kernel
    computes this layer or the device's probe found none exact."""
    if type(layer) in (nn.Linear, nn.Embedding):
        weight = layer["weight"]
        if not kernels.gemv_supports(x, weight):
            return None
        variant = kernels.gemv_variant(x.dtype)
        if variant is None:
            return None
        out = kernels.gemv_rows(x, weight, variant)
        return out + layer["bias"] if "bias" in layer else out
    if type(layer) not in (nn.QuantizedLinear, nn.QuantizedEmbedding):
        return None
    params = {name: layer[name] for name in ("weight", "scales", "biases") if name in layer}
    bits, group_size, mode = layer.bits, layer.group_size, getattr(layer, "mode", "affine")
    if not kernels.supports(x, bits, group_size, mode, params.get("biases")):
        return None
    variant = kernels.qmv_variant(x.dtype, bits, group_size)
    if variant is None:
        return None
    out = kernels.qmv_rows(x, params["weight"], params["scales"], params["biases"], group_size, bits, variant)
    return out + layer["bias"] if "bias" in layer else out


def kernel_attention(
    plan: ExactPlan, queries, keys, values, scale: float, mask: Any, args, kwargs, layout_sensitive: bool
) -> mx.array | None:
    """A causal block in one ``attention_rows`` call, rows as the split computes them (None where it does not apply,
    as where attention is ``layout_sensitive``)."""
    plain = not args and all(v is None for v in kwargs.values()) and not layout_sensitive
    usable = plan.attention == "kernel" and plain and kernels.attention.supports(queries, keys, values, mask)
    variant = kernels.attention_variant(queries.dtype, queries.shape[-1]) if usable else None
    return None if variant is None else kernels.attention_rows(queries, keys, values, scale, mask, variant)
