"""Per-call speed of the row-invariant kernels against MLX's own products, with achieved bandwidth.

``bench_attention`` does the same for ``attention_rows`` against MLX's one-query and multi-query attention.
``probe_kernels`` and ``probe_attention`` survey which variants of each kernel reproduce MLX on this device.

``bench_qmv`` times, for one layer shape, MLX's quantized matmul at 1 row, at w rows in one call
(MLX's fast, not row-invariant family from 8 rows), at w rows in row-invariant chunks of at most
7 rows (what exact verification runs without the kernels), and ``qmv_rows`` at 1 and w rows in each
launch of ``KERNEL_LAUNCHES`` (schedule, features per block), each checked bit for bit against MLX's
one-row products. Each figure is the median over ``repeats`` evaluations of ``calls`` independent
calls, divided by ``calls`` (launch overhead is amortized as in a model's forward), once with the
Python that builds the calls' graphs inside the clock (as a model's forward pays it) and once
without; bandwidth counts the bytes a call must read (weights, scales, biases, inputs) and write.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from specbench.kernels import attention, gemv, qmv
from specbench.kernels.attention import attention_rows, default_vectors_per_warp
from specbench.kernels.bench import per_call_seconds
from specbench.kernels.probe import attention_matches, gemv_matches, qmv_matches
from specbench.kernels.qmv import FEATURES_PER_BLOCK, qmv_rows

#: MLX's quantized matmul is row-invariant for fewer than this many rows (its ``qmv`` family).
MLX_INVARIANT_ROWS = 7


def _chunks(x: mx.array, rows: int, product: Callable[[mx.array], mx.array]) -> mx.array:
    return mx.concatenate([product(x[i : i + rows]) for i in range(0, x.shape[0], rows)])


#: The kernel's launches ``bench_qmv`` times: label -> (schedule, features per block). Each schedule with
#: today's 8 features (warps) per block and with 2: a block's warps are resident together or not at all, so
#: narrower blocks keep more warps per SM where a row count needs many registers (9 rows about 128 per
#: thread, 16 rows about 176, sm_90). The launch shape is not a template constant: no extra compile.
KERNEL_LAUNCHES: dict[str, tuple[str, int]] = {
    "loop": ("loop", FEATURES_PER_BLOCK),
    "loop/2": ("loop", 2),
    "prefetch": ("prefetch", FEATURES_PER_BLOCK),
    "prefetch/2": ("prefetch", 2),
}


def bench_qmv(
    n: int,
    k: int,
    rows: int = 9,
    bits: int = 4,
    group_size: int = 64,
    dtype: mx.Dtype = mx.bfloat16,
    dequant: str = "mul-add",
    peak_gbs: float | None = None,
    calls: int = 32,
    repeats: int = 7,
    launches: dict[str, tuple[str, int]] | None = KERNEL_LAUNCHES,
) -> dict[str, Any]:
    """Per-call microseconds and GB/s of each product of an N x K layer (see the module docstring), each also
    with its graphs built before the clock (``*_eval_us``); per kernel launch (None: MLX's products only, e.g.
    off CUDA), whether its rows at 1 and ``rows`` rows are bit-identical to MLX's one-row products
    (``identical_<label>``)."""
    weight = (mx.random.normal((n, k)) / k**0.5).astype(dtype)
    w, scales, biases = mx.quantize(weight, group_size=group_size, bits=bits)
    x = mx.random.normal((rows, k)).astype(dtype)
    mx.eval(w, scales, biases, x)

    def mlx(a: mx.array) -> mx.array:
        return mx.quantized_matmul(a, w, scales, biases, True, group_size, bits)

    def kernel(schedule: str, per_block: int) -> Callable[[mx.array], mx.array]:
        return lambda a: qmv_rows(a, w, scales, biases, group_size, bits, dequant, schedule, per_block)

    timed: dict[str, Callable[[], mx.array]] = {
        "mlx_1": lambda: mlx(x[:1]),
        f"mlx_fast_{rows}": lambda: mlx(x),
        f"mlx_invariant_{rows}": lambda: _chunks(x, MLX_INVARIANT_ROWS, mlx),
    }
    row: dict[str, Any] = {"n": n, "k": k, "rows": rows, "bits": bits, "group_size": group_size}
    row |= {"dtype": str(dtype).split(".")[-1], "dequant": dequant}
    if launches:
        alone = np.array(mx.concatenate([mlx(x[i : i + 1]) for i in range(rows)]).astype(mx.float32))
        for label, (schedule, per_block) in launches.items():
            product = kernel(schedule, per_block)
            got = [np.array(product(x[:m]).astype(mx.float32)) for m in (1, rows)]
            row[f"identical_{label}"] = bool(np.array_equal(got[0], alone[:1]) and np.array_equal(got[1], alone))
            timed[f"kernel_{label}_1"] = lambda p=product: p(x[:1])
            timed[f"kernel_{label}_{rows}"] = lambda p=product: p(x)
    weight_bytes = w.nbytes + scales.nbytes + biases.nbytes
    for name, call in timed.items():
        m = 1 if name.endswith("_1") else rows
        moved = weight_bytes + m * (k + n) * x.itemsize
        for suffix, built in (("", False), ("_eval", True)):
            seconds = per_call_seconds(call, calls, repeats, built)
            row[f"{name}{suffix}_us"] = seconds * 1e6
            row[f"{name}{suffix}_gbs"] = moved / seconds / 1e9
            if peak_gbs:
                row[f"{name}{suffix}_of_peak"] = row[f"{name}{suffix}_gbs"] / peak_gbs
    return row


def bench_attention(
    n_keys: int,
    rows: int = 9,
    heads: int = 32,
    kv_heads: int = 8,
    head_dim: int = 128,
    dtype: mx.Dtype = mx.bfloat16,
    variant: str = "source",
    vectors_per_warp: int | None = None,
    peak_gbs: float | None = None,
    calls: int = 32,
) -> dict[str, Any]:
    """Microseconds per call of a causal block of ``rows`` queries whose last row attends ``n_keys`` keys:
    MLX's one-query attention (1 row), the ``rows`` one-query calls exact verification runs without the
    kernel (row i over its first ``n_keys - rows + i + 1`` keys), MLX's ``rows``-query causal call (not
    row-invariant), and ``attention_rows`` at 1 and ``rows`` rows; bandwidth counts the keys and values once."""
    scale = head_dim**-0.5
    q = mx.random.normal((1, heads, rows, head_dim)).astype(dtype)
    k = mx.random.normal((1, kv_heads, n_keys, head_dim)).astype(dtype)
    v = mx.random.normal((1, kv_heads, n_keys, head_dim)).astype(dtype)
    mx.eval(q, k, v)
    prefix = n_keys - rows

    def mlx(a: mx.array, n: int, mask: str | None = None) -> mx.array:
        return mx.fast.scaled_dot_product_attention(a, k[:, :, :n], v[:, :, :n], scale=scale, mask=mask)

    def kernel(a: mx.array) -> mx.array:
        return attention_rows(a, k, v, scale, "causal", variant, vectors_per_warp)

    timed = {
        "mlx_1": lambda: mlx(q[:, :, -1:], n_keys),
        f"mlx_split_{rows}": lambda: mx.concatenate(
            [mlx(q[:, :, i : i + 1], prefix + i + 1) for i in range(rows)], axis=2
        ),
        f"mlx_{rows}": lambda: mlx(q, n_keys, "causal"),
        "kernel_1": lambda: attention_rows(q[:, :, -1:], k, v, scale, None, variant, vectors_per_warp),
        f"kernel_{rows}": lambda: kernel(q),
    }
    row: dict[str, Any] = {"n_keys": n_keys, "rows": rows, "heads": heads, "kv_heads": kv_heads}
    row |= {"head_dim": head_dim, "dtype": str(dtype).split(".")[-1], "variant": variant}
    row["vectors_per_warp"] = vectors_per_warp or default_vectors_per_warp(head_dim)
    kv_bytes = k.nbytes + v.nbytes
    for name, call in timed.items():
        seconds = per_call_seconds(call, calls)
        row[f"{name}_us"] = seconds * 1e6
        row[f"{name}_gbs"] = kv_bytes / seconds / 1e9
        if peak_gbs:
            row[f"{name}_of_peak"] = row[f"{name}_gbs"] / peak_gbs
    return row


#: Row counts the probe surveys run (a variant is proved on more before use: ``specbench.kernels.probe``).
SURVEY_ROWS = (1, 2, 9, 16)


def probe_kernels(
    configs: Sequence[tuple[mx.Dtype, int, int]] = ((mx.bfloat16, 4, 64), (mx.bfloat16, 8, 64), (mx.float16, 4, 32)),
    dtypes: Sequence[mx.Dtype] = (mx.bfloat16, mx.float16),
    progress: Any = None,
) -> list[dict[str, Any]]:
    """Which variants of each kernel reproduce MLX here: ``qmv_rows`` for each (dtype, bits, group size) of
    ``configs``, ``gemv_rows`` for each of ``dtypes``."""
    trials: list[tuple[dict[str, Any], Callable[[], dict[str, Any]]]] = []
    for dtype, b, g in configs:
        for dequant in qmv.DEQUANT:
            what = {"kernel": "qmv_rows", "dtype": str(dtype).split(".")[-1], "bits": b, "group_size": g}
            trials.append(
                (what | {"variant": dequant}, functools.partial(qmv_matches, dtype, b, g, dequant, SURVEY_ROWS))
            )
    for dtype in dtypes:
        for accumulate in gemv.ACCUMULATE:
            what = {"kernel": "gemv_rows", "dtype": str(dtype).split(".")[-1], "variant": accumulate}
            trials.append((what, functools.partial(gemv_matches, dtype, accumulate, SURVEY_ROWS)))
    return _survey(trials, progress)


def _survey(
    trials: Sequence[tuple[dict[str, Any], Callable[[], dict[str, Any]]]], progress: Any
) -> list[dict[str, Any]]:
    """Each trial's description with its outcome (an error recorded, not raised), reported through ``progress``."""
    rows = []
    for what, trial in trials:
        try:
            found = trial()
        except Exception as err:
            found = {"exact": False, "error": f"{type(err).__name__}: {err}"}
        rows.append(what | found)
        if progress is not None:
            progress(rows[-1])
    return rows


def probe_attention(
    configs: Sequence[tuple[mx.Dtype, int]] = ((mx.bfloat16, 128), (mx.bfloat16, 64), (mx.float16, 128)),
    variants: Sequence[str] = attention.VARIANTS,
    progress: Any = None,
) -> list[dict[str, Any]]:
    """For each (dtype, head dimension) of ``configs``: which ``variants`` of ``attention_rows`` reproduce MLX here."""
    trials = [
        (
            {"kernel": "attention_rows", "dtype": str(dtype).split(".")[-1], "head_dim": head_dim, "variant": variant},
            functools.partial(attention_matches, dtype, head_dim, variant, rows=SURVEY_ROWS),
        )
        for dtype, head_dim in configs
        for variant in variants
    ]
    return _survey(trials, progress)
