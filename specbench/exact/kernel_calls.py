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
    call = _bound(layer, x)[0]
    return None if call is None else call(x)


def why_no_kernel(layer: nn.Module, x: mx.array) -> str:
    """Why ``kernel_product(layer, x)`` is None: the layer or dtype no kernel computes, or no variant proved here."""
    return _bound(layer, x)[1]


def _bound(layer: nn.Module, x: mx.array) -> tuple[Callable[[mx.array], mx.array] | None, str]:
    bound = layer.__dict__.get(_BOUND)
    if bound is None or bound[0] is not layer.get("weight") or bound[1] != (x.dtype, x.shape[-1]):
        bound = (layer.get("weight"), (x.dtype, x.shape[-1]), *_bind(layer, x))
        object.__setattr__(layer, _BOUND, bound)
    return bound[2], bound[3]


#: The attribute a layer's settled kernel call is kept under.
_BOUND = "_specbench_kernel_call"


def _bind(layer: nn.Module, x: mx.array) -> tuple[Callable[[mx.array], mx.array] | None, str]:
    """The kernel call that computes ``layer(x)`` for inputs like ``x`` (None where none does), and why not."""
    bias = layer["bias"] if "bias" in layer else None
    name = type(layer).__name__
    if type(layer) in (nn.Linear, nn.Embedding):
        weight = layer["weight"]
        if not kernels.gemv_supports(x, weight):
            return None, f"gemv_rows does not compute {name} of {weight.dtype} weights on {x.dtype} inputs"
        variant = kernels.gemv_variant(x.dtype)
        if variant is None:
            return None, f"no gemv_rows variant proved for {x.dtype} on this device"
        product = functools.partial(kernels.gemv_rows, weight=weight, accumulate=variant)
    elif type(layer) in (nn.QuantizedLinear, nn.QuantizedEmbedding):
        params = {name: layer[name] for name in ("weight", "scales", "biases") if name in layer}
        bits, group_size, mode = layer.bits, layer.group_size, getattr(layer, "mode", "affine")
        if not kernels.supports(x, bits, group_size, mode, params.get("biases"), n=params["weight"].shape[0]):
            return None, f"qmv_rows does not compute {name} ({mode}, {bits} bits, group {group_size}) on {x.dtype}"
        variant = kernels.qmv_variant(x.dtype, bits, group_size)
        if variant is None:
            return None, f"no qmv_rows variant proved for {x.dtype}, {bits} bits, group {group_size} on this device"
        product = kernels.launcher(
            params["weight"], params["scales"], params["biases"], group_size, bits, x.dtype, x.shape[-1], variant
        )
    else:
        return None, f"no kernel computes {name}"
    return (product if bias is None else lambda rows: product(rows) + bias), ""


def kernel_attention(
    plan: ExactPlan,
    queries,
    keys,
    values,
    scale: float,
    mask: Any,
    args,
    kwargs,
    layout_sensitive: bool,
    starts: list[int] | None = None,
) -> mx.array | str:
    """A causal block in one ``attention_rows`` call, rows as the split computes them; ``starts``: each batch row's
    first key (a batch cache's left padding). Where it does not apply (as where attention is ``layout_sensitive``):
    why not, as a line."""
    if plan.attention != "kernel":
        return "the level does not name attention/kernel"
    if args or any(v is not None for v in kwargs.values()) or layout_sensitive:
        return "extra attention arguments, or a layout-sensitive attention (cuDNN)"
    if not kernels.attention.supports(queries, keys, values, mask, starts):
        return kernels.attention.check_inputs(queries, keys, values, mask, starts) or "attention_rows does not take it"
    variant = kernels.attention_variant(queries.dtype, queries.shape[-1])
    if variant is None:
        return f"no attention_rows variant proved for {queries.dtype}, head dimension {queries.shape[-1]} here"
    return kernels.attention_rows(queries, keys, values, scale, mask, variant, starts=starts)
