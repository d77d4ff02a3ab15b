"""The op probe: which ops compute each row on its own on the current device.

Exact mode splits attention, linear layers and MoE expert products row by row
(``specbench.exact.plan``); every other op of the mlx-lm models (embedding, RMSNorm, RoPE at an
offset, elementwise ops, softmax and top-k routing, residual sums) must compute each row as it
does for one row. ``probe_ops`` checks that.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from numbers import Integral
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np


def probe_ops(
    dtype: mx.Dtype = mx.bfloat16, widths: Sequence[int] = (2, 4, 8, 16), dim: int = 512, seed: int = 0
) -> list[dict[str, Any]]:
    """Which ops compute each row as they do for one row, on the current device: each op applied to w rows at
    once and to each row alone (a decode step's call), compared bit for bit. The ops every mlx-lm transformer
    runs besides the split ones, and the split ones (matmul, quantized matmul, attention) for contrast.

    ``dim`` (the hidden size) is a positive multiple of 64 (the quantized matmul's group size) and ``widths``
    are integers >= 1; a ValueError naming them otherwise, before any op runs.
    """
    if isinstance(dim, bool) or not isinstance(dim, Integral) or dim < 64 or dim % 64:
        raise ValueError(f"dim must be a positive multiple of 64 (the quantization group size), got {dim!r}")
    widths = list(widths)
    if not widths or not all(isinstance(w, Integral) and not isinstance(w, bool) and w >= 1 for w in widths):
        raise ValueError(f"widths must be a non-empty list of integers >= 1, got {widths!r}")
    if not mx.issubdtype(dtype, mx.floating):
        raise ValueError(f"dtype must be a floating type (bfloat16, float16, float32), got {dtype}")
    mx.random.seed(seed)
    heads, head_dim, vocab, experts, top_k, offset = 8, 64, 4096, 64, 8, 100
    rows: list[dict[str, Any]] = []

    def rand(*shape):
        return mx.random.normal(shape).astype(dtype)

    weight = rand(dim) + 1
    linear = rand(dim * 2, dim) / dim**0.5
    qw, qs, qb = mx.quantize(linear, group_size=64, bits=4)
    embed = rand(vocab, dim)
    kv_shape = (1, heads // 4, offset + max(widths), head_dim)
    keys, values = rand(*kv_shape), rand(*kv_shape)

    def swiglu(x):
        half = x.shape[-1] // 2
        return nn.silu(x[..., :half]) * x[..., half:]

    def topk(x):
        return mx.sort(mx.argpartition(x, kth=-top_k, axis=-1)[..., -top_k:], axis=-1)

    ops: dict[str, tuple[Callable[[int], mx.array], Callable[[mx.array, int, int], mx.array]]] = {
        # name: (input for w rows, f(x, first_row, rows)) computing the op over rows [first, first+rows)
        "embedding": (lambda w: mx.random.randint(0, vocab, (1, w)), lambda x, i, n: embed[x]),
        "rms_norm": (lambda w: rand(1, w, dim), lambda x, i, n: mx.fast.rms_norm(x, weight, 1e-6)),
        "rope": (
            lambda w: rand(1, heads, w, head_dim),
            lambda x, i, n: mx.fast.rope(x, head_dim, traditional=False, base=1e6, scale=1.0, offset=offset + i),
        ),
        "swiglu": (lambda w: rand(1, w, dim), lambda x, i, n: swiglu(x)),
        "residual_add": (lambda w: rand(1, w, dim), lambda x, i, n: x + x[..., ::-1]),
        "router_softmax": (lambda w: rand(1, w, experts), lambda x, i, n: mx.softmax(x, axis=-1, precise=True)),
        "router_topk": (lambda w: rand(1, w, experts), lambda x, i, n: topk(x)),
        "expert_sum": (  # experts' outputs weighted by the router's scores (here: the first column)
            lambda w: rand(1, w, top_k, dim),
            lambda x, i, n: (x * x[..., :1]).sum(axis=-2).astype(x.dtype),
        ),
        "logsumexp": (lambda w: rand(w, vocab), lambda x, i, n: mx.logsumexp(x, axis=-1, keepdims=True)),
        "argmax": (
            lambda w: rand(w, vocab),
            lambda x, i, n: mx.argmax(x - mx.logsumexp(x, axis=-1, keepdims=True), axis=-1),
        ),
        "matmul": (lambda w: rand(1, w, dim), lambda x, i, n: x @ linear.T),
        "quantized_matmul": (
            lambda w: rand(1, w, dim),
            lambda x, i, n: mx.quantized_matmul(x, qw, qs, qb, transpose=True, group_size=64, bits=4),
        ),
        "attention": (
            lambda w: rand(1, heads, w, head_dim),
            lambda x, i, n: mx.fast.scaled_dot_product_attention(
                x,
                keys[..., : offset + i + n, :],
                values[..., : offset + i + n, :],
                scale=head_dim**-0.5,
                mask="causal" if n > 1 else None,
            ),
        ),
    }
    for name, (make, op) in ops.items():
        for w in widths:
            x = make(w)
            row_axis = 2 if name in ("rope", "attention") else 1
            if x.ndim == 2 and name in ("logsumexp", "argmax"):
                row_axis = 0
            together = op(x, 0, w)
            alone = [op(mx.take(x, mx.array([i]), axis=row_axis), i, 1) for i in range(w)]
            joined = mx.concatenate(alone, axis=row_axis if together.ndim > row_axis else 0)
            mx.eval(together, joined)
            same = bool(np.array_equal(_host(together), _host(joined)))
            rows.append({"op": name, "dtype": str(dtype).split(".")[-1], "width": w, "row_invariant": same})
    return rows


def _host(x: mx.array) -> np.ndarray:
    """``x`` as a numpy array (floats as float32, which holds every bfloat16 and float16 value)."""
    return np.array(x if x.dtype == mx.uint32 else x.astype(mx.float32))
