"""The split's calls through the row-invariant kernels (``specbench.kernels``), where the device's probe proved them.

A linear layer (``linear/kernel``): quantized through ``qmv_rows``, dense through ``gemv_rows``, every row as MLX's
one-row product, in one call. Causal attention (``attention/kernel``): every row in one ``attention_rows`` call, as
the one-query call computes it. Each answers None where it does not apply, and the split (``specbench.exact.hooks``)
then runs the rows through the layer's own calls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specbench import kernels
from specbench.exact.plan import ExactPlan


def kernel_product(layer: nn.Module, x: mx.array) -> mx.array | None:
    """``layer(x)`` through a row-invariant kernel, every row as MLX's one-row product: a
    ``QuantizedLinear`` (or a ``QuantizedEmbedding``'s ``as_linear``) through ``kernels.qmv_rows``, a
    ``Linear`` (or an ``Embedding``'s ``as_linear``) through ``kernels.gemv_rows``. None where no kernel
    computes this layer or the device's probe found none exact.

    What a layer's call needs besides ``x`` (the probe's variant, the kernel's settings, the scales in the
    activation type) is settled on its first call and kept on the layer, for as long as its weight array and
    the activation's type and width stay the same: a verify forward makes hundreds of these calls, and their
    host time is part of what exact verification costs."""
    bound = layer.__dict__.get(_BOUND)
    if bound is None or bound[0] is not layer.get("weight") or bound[1] != (x.dtype, x.shape[-1]):
        bound = (layer.get("weight"), (x.dtype, x.shape[-1]), _bind(layer, x))
        object.__setattr__(layer, _BOUND, bound)
    call = bound[2]
    return None if call is None else call(x)


#: The attribute a layer's settled kernel call is kept under.
_BOUND = "_specbench_kernel_call"


def _bind(layer: nn.Module, x: mx.array) -> Callable[[mx.array], mx.array] | None:
    """The kernel call that computes ``layer(x)`` for inputs like ``x`` (None where none does)."""
    bias = layer["bias"] if "bias" in layer else None
    if type(layer) in (nn.Linear, nn.Embedding):
        weight = layer["weight"]
        if not kernels.gemv_supports(x, weight):
            return None
        variant = kernels.gemv_variant(x.dtype)
        if variant is None:
            return None
        product = functools.partial(kernels.gemv_rows, weight=weight, accumulate=variant)
    elif type(layer) in (nn.QuantizedLinear, nn.QuantizedEmbedding):
        params = {name: layer[name] for name in ("weight", "scales", "biases") if name in layer}
        bits, group_size, mode = layer.bits, layer.group_size, getattr(layer, "mode", "affine")
        if not kernels.supports(x, bits, group_size, mode, params.get("biases"), n=params["weight"].shape[0]):
            return None
        variant = kernels.qmv_variant(x.dtype, bits, group_size)
        if variant is None:
            return None
        product = kernels.launcher(
            params["weight"], params["scales"], params["biases"], group_size, bits, x.dtype, x.shape[-1], variant
        )
    else:
        return None
    return product if bias is None else lambda rows: product(rows) + bias


def kernel_attention(
    plan: ExactPlan, queries, keys, values, scale: float, mask: Any, args, kwargs, layout_sensitive: bool
) -> mx.array | None:
    """A causal block in one ``attention_rows`` call, rows as the split computes them (None where it does not apply,
    as where attention is ``layout_sensitive``)."""
    plain = not args and all(v is None for v in kwargs.values()) and not layout_sensitive
    usable = plan.attention == "kernel" and plain and kernels.attention.supports(queries, keys, values, mask)
    variant = kernels.attention_variant(queries.dtype, queries.shape[-1]) if usable else None
    return None if variant is None else kernels.attention_rows(queries, keys, values, scale, mask, variant)
