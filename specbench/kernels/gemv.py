"""A w-row matrix-vector product of unquantized weights whose every row is MLX's one-row product, bit for bit.

For one row (``M == 1``, weights transposed, as a ``Linear`` layer runs) MLX's CUDA matmul runs its
``gemv`` kernel (``gemms/gemv.cu``): one warp per output feature, lane ``t`` reading ``n`` adjacent
inputs at ``n * t + r * 32 * n`` in pass r (``n`` = 4 when K is a multiple of 128, 2 for 64, else 1),
each product added to one float accumulator per lane (``sum += float(w) * float(x)``), then the
warp's ``cg::reduce``. For more rows it calls cuBLAS, whose rows are not those of the one-row product.

``gemv_rows`` runs that arithmetic for up to ``MAX_ROWS`` rows in one launch, reading each weight chunk
once: a row's result does not depend on the other rows, and equals MLX's one-row product where the
accumulation rounds as MLX's build does (one fused multiply-add, or a product then a sum: the device's
probe finds which, ``specbench.kernels.probe``). ``gemv_rows_reference`` is the same order of
additions in MLX ops (products and sums rounded separately), row-invariant by construction.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from specbench.kernels.jit import butterfly, kernel_name, launch_in_row_blocks
from specbench.kernels.qmv import FEATURES_PER_BLOCK, MAX_ROWS, WARP

DTYPES = (mx.bfloat16, mx.float16, mx.float32)
#: How a lane accumulates: "fma" (one rounding, as nvcc contracts ``sum += a * b`` by default), "mul-add"
#: (a rounded product, then a rounded sum).
ACCUMULATE = ("fma", "mul-add")

_SOURCE = r"""
  const int lane = threadIdx.x;
  const int n = w_shape[0];
  const int k = x_shape[1];
  const int feature = blockIdx.x * blockDim.y + threadIdx.y;
  if (feature >= n) {
    return;
  }
  const T* wrow = w + (int64_t)feature * k;
  float sums[ROWS];
  #pragma unroll
  for (int m = 0; m < ROWS; ++m) {
    sums[m] = 0.0f;
  }
  for (int col = NPT * lane; col < k; col += 32 * NPT) {
    float wv[NPT];
    #pragma unroll
    for (int j = 0; j < NPT; ++j) {
      wv[j] = static_cast<float>(wrow[col + j]);
    }
    #pragma unroll
    for (int m = 0; m < ROWS; ++m) {
      const T* xrow = x + (int64_t)m * k + col;
      #pragma unroll
      for (int j = 0; j < NPT; ++j) {
        if constexpr (MODE == 0) {
          sums[m] = __fmaf_rn(wv[j], static_cast<float>(xrow[j]), sums[m]);
        } else {
          sums[m] = __fadd_rn(sums[m], __fmul_rn(wv[j], static_cast<float>(xrow[j])));
        }
      }
    }
  }
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  #pragma unroll
  for (int m = 0; m < ROWS; ++m) {
    const float sum = cg::reduce(warp, sums[m], cg::plus<float>());
    if (lane == 0) {
      out[(int64_t)m * n + feature] = static_cast<T>(sum);
    }
  }
"""

_HEADER = r"""
#include <cooperative_groups/reduce.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
"""


def elements_per_lane(k: int) -> int:
    """MLX's ``gemv`` choice of adjacent inputs per lane and pass for an input width ``k`` (aligned inputs)."""
    return 4 if k % 128 == 0 else 2 if k % 64 == 0 else 1


def supports(x: mx.array, weight: mx.array) -> bool:
    """Whether ``gemv_rows`` computes ``x @ weight.T``: bfloat16, float16 or float32 inputs and weights of
    one dtype, ``weight`` [N, K] with K the last axis of ``x``."""
    return x.dtype in DTYPES and weight.dtype == x.dtype and weight.ndim == 2 and weight.shape[1] == x.shape[-1]


@functools.cache
def _kernel() -> Any:
    return mx.fast.cuda_kernel(
        name=kernel_name("specbench_gemv_rows", _HEADER, _SOURCE),
        input_names=["x", "w"],
        output_names=["out"],
        source=_SOURCE,
        header=_HEADER,
    )


def gemv_rows(x: mx.array, weight: mx.array, accumulate: str = "fma") -> mx.array:
    """``x @ weight.T`` with every row computed as MLX's one-row ``gemv`` computes it (CUDA)."""
    if not supports(x, weight):
        raise ValueError(
            f"gemv_rows computes x @ weight.T for {[str(d) for d in DTYPES]} inputs and weights of the same dtype "
            f"and width, got x {x.dtype} {x.shape}, weight {weight.dtype} {weight.shape}"
        )
    if accumulate not in ACCUMULATE:
        raise ValueError(f"unknown accumulation {accumulate!r}: use one of {ACCUMULATE}")
    k, n = x.shape[-1], weight.shape[0]
    template = [("T", x.dtype), ("NPT", elements_per_lane(k)), ("MODE", ACCUMULATE.index(accumulate))]
    grid = (WARP * -(-n // FEATURES_PER_BLOCK), FEATURES_PER_BLOCK, 1)
    return launch_in_row_blocks(_kernel(), x, n, [weight], template, grid, (WARP, FEATURES_PER_BLOCK, 1), MAX_ROWS)


def gemv_rows_reference(x: mx.array, weight: mx.array) -> mx.array:
    """``gemv_rows``'s order of additions in MLX ops: per lane, one float sum over its inputs in order
    (product and sum rounded separately), then the warp's butterfly reduction."""
    k, n = x.shape[-1], weight.shape[0]
    npt = elements_per_lane(k)
    flat = x.reshape(-1, k).astype(mx.float32)
    w = weight.astype(mx.float32)
    per_pass = WARP * npt
    passes = -(-k // per_pass)
    padded = passes * per_pass
    if padded != k:  # lanes past K add nothing: pad with zeros (adding +0.0 leaves a float sum unchanged)
        flat = mx.pad(flat, [(0, 0), (0, padded - k)])
        w = mx.pad(w, [(0, 0), (0, padded - k)])
    xs = flat.reshape(-1, 1, passes, WARP, npt)
    ws = w.reshape(1, n, passes, WARP, npt)
    lanes = mx.zeros((flat.shape[0], n, WARP), dtype=mx.float32)
    for r in range(passes):
        for j in range(npt):
            lanes = lanes + xs[:, :, r, :, j] * ws[:, :, r, :, j]
    return butterfly(lanes).astype(x.dtype).reshape(*x.shape[:-1], n)
