"""Per-call speed of the row-invariant kernels against MLX's own products, with achieved bandwidth.

``bench_qmv`` times, for one layer shape, MLX's quantized matmul at 1 row, at w rows in one call
(MLX's fast, not row-invariant family from 8 rows), at w rows in row-invariant chunks of at most
7 rows (what exact verification runs without the kernels), and ``qmv_rows`` at 1 and w rows.
Each figure is the median over ``repeats`` evaluations of ``calls`` independent calls, divided by
``calls`` (launch overhead is amortized as in a model's forward); bandwidth counts the bytes a call
must read (weights, scales, biases, inputs) and write.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from specbench.kernels.qmv import qmv_rows

#: MLX's quantized matmul is row-invariant for fewer than this many rows (its ``qmv`` family).
MLX_INVARIANT_ROWS = 7


def per_call_seconds(call: Callable[[], mx.array], calls: int = 32, repeats: int = 7) -> float:
    """Median seconds of one call, each evaluation running ``calls`` independent calls."""
    mx.eval(call())
    times = []
    for _ in range(repeats):
        mx.synchronize()
        t0 = time.perf_counter()
        mx.eval([call() for _ in range(calls)])
        mx.synchronize()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def _chunks(x: mx.array, rows: int, product: Callable[[mx.array], mx.array]) -> mx.array:
    return mx.concatenate([product(x[i : i + rows]) for i in range(0, x.shape[0], rows)])


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
) -> dict[str, Any]:
    """Microseconds per call of each product of an N x K layer (see the module docstring)."""
    weight = (mx.random.normal((n, k)) / k**0.5).astype(dtype)
    w, scales, biases = mx.quantize(weight, group_size=group_size, bits=bits)
    x = mx.random.normal((rows, k)).astype(dtype)
    mx.eval(w, scales, biases, x)

    def mlx(a: mx.array) -> mx.array:
        return mx.quantized_matmul(a, w, scales, biases, True, group_size, bits)

    def kernel(a: mx.array) -> mx.array:
        return qmv_rows(a, w, scales, biases, group_size, bits, dequant)

    timed = {
        "mlx_1": lambda: mlx(x[:1]),
        f"mlx_fast_{rows}": lambda: mlx(x),
        f"mlx_invariant_{rows}": lambda: _chunks(x, MLX_INVARIANT_ROWS, mlx),
        "kernel_1": lambda: kernel(x[:1]),
        f"kernel_{rows}": lambda: kernel(x),
    }
    row: dict[str, Any] = {"n": n, "k": k, "rows": rows, "bits": bits, "group_size": group_size}
    row["dtype"] = str(dtype).split(".")[-1]
    weight_bytes = w.nbytes + scales.nbytes + biases.nbytes
    for name, call in timed.items():
        seconds = per_call_seconds(call, calls)
        row[f"{name}_us"] = seconds * 1e6
        m = 1 if name.endswith("_1") else rows
        gbs = (weight_bytes + m * (k + n) * x.itemsize) / seconds / 1e9
        row[f"{name}_gbs"] = gbs
        if peak_gbs:
            row[f"{name}_of_peak"] = gbs / peak_gbs
    return row
