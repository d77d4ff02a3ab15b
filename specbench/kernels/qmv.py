"""A w-row quantized matrix-vector product whose every row is MLX's one-row product, bit for bit.

MLX's CUDA quantized matmul runs ``qmv`` for fewer than 8 rows (``quantized/qmm/qmv.cu``): one
warp per output feature, lane ``t`` owning the ``EPT`` inputs ``t * EPT + r * 32 * EPT`` (+ j) of
each pass r over K, the weights dequantized in the activation type T (``q * scale + bias``), the
lane's ``EPT`` partial sums kept in T (fused multiply-adds, for weights under 8 bits) or in float
(8 bits), then summed in float in order and reduced over the warp by ``cg::reduce`` (a butterfly
over lane masks 16, 8, 4, 2, 1). Its cost grows with rows because each row re-reads the weights;
from 8 rows MLX switches to a tiled kernel whose rows are not those of the one-row product.

``qmv_rows`` runs the same arithmetic for up to ``MAX_ROWS`` rows in one launch: each weight chunk
is read and dequantized once and the FMA sequence, conversion and warp reduction of ``qmv`` run
for each row. A row's result therefore does not depend on the other rows, and equals MLX's
one-row product wherever the dequantization rounds as MLX's build does; which ``dequant`` variant
that is (the two roundings of ``mul`` then ``add``, or one fused multiply-add) is for the device's
probe to find, not for this file to assume (``specbench.kernels.probe``).

A lane's passes over K are walked by one of ``SCHEDULES``, both calling one ``compute`` (dequantize,
then each row's FMAs) in qmv's pass order: the schedule moves the reads, not the arithmetic. Which is
faster is for the device's benchmark to say (``scripts/gpu/kernels.py``), which also checks both
against MLX bit for bit (a compiler contracts each instance of ``mul`` then ``add`` on its own).

``qmv_rows_reference`` is the same arithmetic in MLX ops (it runs on any device); it differs from
the kernel only in that its multiply-adds round twice (a product, then a sum) where the kernel's
round once, so it is row-invariant by construction and close to, not equal to, the kernel.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from specbench.kernels import qmv_metal
from specbench.kernels.jit import QuantizedRowsLauncher, butterfly, kernel_name

#: Rows one launch computes; more rows run in launches of this many (each row is on its own anyway).
MAX_ROWS = 16
WARP = 32
#: Features (output columns) per thread block: one warp each, as in MLX's ``qmv``.
FEATURES_PER_BLOCK = 8
BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
DTYPES = (mx.bfloat16, mx.float16)
#: How the weights are dequantized: "mul-add" as MLX's source writes it (``__hmul`` then ``__hadd``,
#: which the compiler may fuse), "fma" (one rounding), "mul-add-rn" (two roundings, never fused).
DEQUANT = ("mul-add", "fma", "mul-add-rn")
#: How a lane walks its passes over K (the arithmetic is the same in each, so are the results): "loop"
#: reads a pass's packed weights, scale and bias and then computes it; "prefetch" reads the next pass's
#: (its packed words in one 8-byte load) before computing the current one, so that the reads of one
#: pass overlap the arithmetic of the other.
SCHEDULES = ("loop", "prefetch")
#: The schedule ``qmv_rows`` runs unless told (and the one its probe proves).
DEFAULT_SCHEDULE = "loop"

_HEADER = r"""
#include <cooperative_groups/reduce.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace specbench_qmv {

template <typename T> struct ops;

template <> struct ops<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static __device__ __forceinline__ __nv_bfloat16 from_int(int q) { return __int2bfloat16_rn(q); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  template <int MODE>
  static __device__ __forceinline__ __nv_bfloat16 dequant(__nv_bfloat16 q, __nv_bfloat16 s, __nv_bfloat16 b) {
    if constexpr (MODE == 0) { return __hadd(__hmul(q, s), b); }
    else if constexpr (MODE == 1) { return __hfma(q, s, b); }
    else { return __hadd_rn(__hmul_rn(q, s), b); }
  }
  static __device__ __forceinline__ T2 fma2(T2 a, T2 b, T2 c) { return __hfma2(a, b, c); }
};

template <> struct ops<__half> {
  using T2 = __half2;
  static __device__ __forceinline__ __half from_int(int q) { return __int2half_rn(q); }
  static __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
  template <int MODE>
  static __device__ __forceinline__ __half dequant(__half q, __half s, __half b) {
    if constexpr (MODE == 0) { return __hadd(__hmul(q, s), b); }
    else if constexpr (MODE == 1) { return __hfma(q, s, b); }
    else { return __hadd_rn(__hmul_rn(q, s), b); }
  }
  static __device__ __forceinline__ T2 fma2(T2 a, T2 b, T2 c) { return __hfma2(a, b, c); }
};

}  // namespace specbench_qmv
"""

# The body of ``qmv_rows``: template constants T, BITS, GROUP, ROWS, RESIDUE, MODE, SCHEDULE; inputs x [ROWS, K],
# w [N, K * BITS / 32] (uint32), scales and biases [N, K / GROUP]; output out [ROWS, N].
_SOURCE = r"""
  using O = specbench_qmv::ops<T>;
  using T2 = typename O::T2;
  constexpr int EPT = BITS <= 4 ? 16 : 8;         // elements per lane and pass, as qmv
  constexpr int PER_WARP = 32 * EPT;
  constexpr int WORDS = EPT * BITS / 32;           // packed words per lane and pass
  constexpr bool FLOAT_SUMS = BITS >= 8;
  auto warp = cg::tiled_partition<32>(cg::this_thread_block());
  const int lane = warp.thread_rank();
  const int n = w_shape[0];
  const int k = x_shape[1];
  const int feature = blockIdx.x * blockDim.y + threadIdx.y;
  if (feature >= n) {
    return;
  }
  const int groups = k / GROUP;
  const uint32_t* wrow = w + (int64_t)feature * (k * BITS / 32);
  const T* srow = scales + (int64_t)feature * groups;
  const T* brow = biases + (int64_t)feature * groups;

  T2 hsums[FLOAT_SUMS ? 1 : ROWS][EPT / 2];
  float fsums[FLOAT_SUMS ? ROWS : 1][FLOAT_SUMS ? EPT : 1];
  #pragma unroll
  for (int m = 0; m < ROWS; ++m) {
    #pragma unroll
    for (int j = 0; j < EPT / 2; ++j) {
      if constexpr (FLOAT_SUMS) { fsums[m][2 * j] = 0.0f; fsums[m][2 * j + 1] = 0.0f; }
      else { hsums[m][j] = T2(O::from_float(0.0f), O::from_float(0.0f)); }
    }
  }

  // One pass's weights for this lane, as read from memory: the packed words of its EPT inputs
  // (a lane's chunk lies inside one group: GROUP is a multiple of EPT) and that group's scale and bias.
  struct Chunk {
    uint32_t packed[WORDS];
    T s;
    T b;
  };
  auto load = [&](int idx) {
    Chunk c;
    c.s = srow[idx / GROUP];
    c.b = brow[idx / GROUP];
    if constexpr (SCHEDULE == 1 && WORDS == 2) {
      // one 8-byte load: idx * BITS / 32 and the row's start (k * BITS / 32 words, k % 16 == 0) are even
      const uint2 v = *reinterpret_cast<const uint2*>(wrow + idx * BITS / 32);
      c.packed[0] = v.x;
      c.packed[1] = v.y;
    } else {
      #pragma unroll
      for (int i = 0; i < WORDS; ++i) {
        c.packed[i] = wrow[idx * BITS / 32 + i];
      }
    }
    return c;
  };
  // The arithmetic of one pass, the same in every schedule: dequantize once, then each row's FMAs.
  auto compute = [&](int idx, const Chunk& c) {
    T wq[EPT];
    #pragma unroll
    for (int j = 0; j < EPT; ++j) {
      const int q = (c.packed[(j * BITS) / 32] >> ((j * BITS) % 32)) & ((1u << BITS) - 1u);
      wq[j] = O::template dequant<MODE>(O::from_int(q), c.s, c.b);
    }
    #pragma unroll
    for (int m = 0; m < ROWS; ++m) {
      const uint4* xv = reinterpret_cast<const uint4*>(x + (int64_t)m * k + idx);
      T xs[EPT];
      #pragma unroll
      for (int v = 0; v < EPT / 8; ++v) {
        *reinterpret_cast<uint4*>(xs + 8 * v) = xv[v];
      }
      #pragma unroll
      for (int j = 0; j < EPT / 2; ++j) {
        if constexpr (FLOAT_SUMS) {
          fsums[m][2 * j] = fmaf(O::to_float(xs[2 * j]), O::to_float(wq[2 * j]), fsums[m][2 * j]);
          fsums[m][2 * j + 1] = fmaf(O::to_float(xs[2 * j + 1]), O::to_float(wq[2 * j + 1]), fsums[m][2 * j + 1]);
        } else {
          hsums[m][j] = O::fma2(T2(xs[2 * j], xs[2 * j + 1]), T2(wq[2 * j], wq[2 * j + 1]), hsums[m][j]);
        }
      }
    }
  };

  // This lane's passes over K in qmv's order: pass r at lane * EPT + r * PER_WARP, then (RESIDUE) the
  // partial pass at k - k % PER_WARP = passes * PER_WARP, for the lanes whose chunk lies inside K.
  const int passes = k / PER_WARP;
  if constexpr (SCHEDULE == 0) {
    for (int r = 0; r < passes; ++r) {
      const int idx = lane * EPT + r * PER_WARP;
      compute(idx, load(idx));
    }
    if constexpr (RESIDUE) {
      const int idx = lane * EPT + passes * PER_WARP;
      if (idx < k) {
        compute(idx, load(idx));
      }
    }
  } else {
    // prefetch: the next pass's words, scale and bias are read before this pass is computed
    const int count = passes + ((RESIDUE && lane * EPT + passes * PER_WARP < k) ? 1 : 0);
    if (count > 0) {
      Chunk next = load(lane * EPT);
      for (int r = 0; r < count; ++r) {
        const Chunk current = next;
        const int idx = lane * EPT + r * PER_WARP;
        if (r + 1 < count) {
          next = load(idx + PER_WARP);
        }
        compute(idx, current);
      }
    }
  }

  #pragma unroll
  for (int m = 0; m < ROWS; ++m) {
    float sum = 0.0f;
    #pragma unroll
    for (int j = 0; j < EPT / 2; ++j) {
      if constexpr (FLOAT_SUMS) {
        sum += fsums[m][2 * j];
        sum += fsums[m][2 * j + 1];
      } else {
        sum += O::to_float(hsums[m][j].x);
        sum += O::to_float(hsums[m][j].y);
      }
    }
    sum = cg::reduce(warp, sum, cg::plus<float>());
    if (lane == 0) {
      out[(int64_t)m * n + feature] = O::from_float(sum);
    }
  }
"""


def supports(
    x: mx.array, bits: int, group_size: int, mode: str = "affine", biases: Any = True, n: int | None = None
) -> bool:
    """Whether ``qmv_rows`` computes this product: affine weights with biases, 4 or 8 bits, group
    size 32/64/128, bfloat16 or float16 activations whose last axis is a multiple of the group size; on Metal
    (``n``: the output features) only the shapes MLX's one-row ``qmv_fast`` takes (``specbench.kernels.qmv_metal``)."""
    if qmv_metal.metal_available():
        return n is not None and qmv_metal.supports(x, n, bits, group_size, mode, biases)
    k = x.shape[-1]
    return (
        mode == "affine"
        and biases is not None
        and bits in BITS
        and group_size in GROUP_SIZES
        and x.dtype in DTYPES
        and k % group_size == 0
        and k % 16 == 0
    )


def launcher(
    w: mx.array,
    scales: mx.array,
    biases: mx.array,
    group_size: int,
    bits: int,
    dtype: mx.Dtype,
    k: int,
    variant: str,
    **layout: Any,
) -> QuantizedRowsLauncher:
    """The launcher of the probe's ``variant`` for one layer: Metal's (``qmv_metal.VARIANT``) or CUDA's (with its
    ``layout``: ``schedule``, ``features_per_block``)."""
    if variant == qmv_metal.VARIANT:
        return qmv_metal.MetalQmvLauncher(w, scales, biases, group_size, bits, dtype, k)
    return QmvLauncher(w, scales, biases, group_size, bits, dtype, k, variant, **layout)


@functools.cache
def _kernel() -> Any:
    return mx.fast.cuda_kernel(
        name=kernel_name("specbench_qmv_rows", _HEADER, _SOURCE),
        input_names=["x", "w", "scales", "biases"],
        output_names=["out"],
        source=_SOURCE,
        header=_HEADER,
    )


def qmv_rows(
    x: mx.array,
    w: mx.array,
    scales: mx.array,
    biases: mx.array,
    group_size: int,
    bits: int,
    dequant: str = "mul-add",
    schedule: str = DEFAULT_SCHEDULE,
    features_per_block: int = FEATURES_PER_BLOCK,
) -> mx.array:
    """``mx.quantized_matmul(x, w, scales, biases, transpose=True, group_size, bits)`` with every row
    computed as MLX's one-row ``qmv`` computes it (CUDA; see the module docstring; ``dequant="metal"``: on
    Metal, ``specbench.kernels.qmv_metal``). How the work is laid
    out changes when reads happen, not the arithmetic: ``schedule`` walks the passes over K
    (``SCHEDULES``), ``features_per_block`` is the warps (one per output feature) of a thread block."""
    if not supports(x, bits, group_size, biases=biases, n=w.shape[0]):
        raise ValueError(
            f"qmv_rows computes affine {BITS}-bit products with group size {GROUP_SIZES} and "
            f"{[str(d) for d in DTYPES]} inputs, got {bits} bits, group size {group_size}, {x.dtype}, K={x.shape[-1]}"
            + (" (on Metal: N a multiple of 8, K of the pass length)" if qmv_metal.metal_available() else "")
        )
    layout = {"schedule": schedule, "features_per_block": features_per_block}
    return launcher(w, scales, biases, group_size, bits, x.dtype, x.shape[-1], dequant, **layout)(x)


class QmvLauncher(QuantizedRowsLauncher):
    """``qmv_rows`` on CUDA for one layer and activation type (``QuantizedRowsLauncher``; exact mode keeps one per
    layer: ``specbench.exact.kernel_calls``)."""

    __slots__ = ()
    max_rows = MAX_ROWS

    def __init__(
        self,
        w: mx.array,
        scales: mx.array,
        biases: mx.array,
        group_size: int,
        bits: int,
        dtype: mx.Dtype,
        k: int,
        dequant: str = "mul-add",
        schedule: str = DEFAULT_SCHEDULE,
        features_per_block: int = FEATURES_PER_BLOCK,
    ) -> None:
        if dequant not in DEQUANT:
            raise ValueError(f"unknown dequant variant {dequant!r}: use one of {DEQUANT}")
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r}: use one of {SCHEDULES}")
        if not 1 <= features_per_block <= 32:
            raise ValueError(f"features_per_block must be 1 to 32 (warps of a block), got {features_per_block}")
        self.settle(w, scales, biases, dtype, k)
        per_warp = WARP * (16 if bits <= 4 else 8)
        self.template = [
            ("T", dtype),
            ("BITS", bits),
            ("GROUP", group_size),
            ("RESIDUE", k % per_warp != 0),
            ("MODE", DEQUANT.index(dequant)),
            ("SCHEDULE", SCHEDULES.index(schedule)),
        ]
        blocks = -(-self.n // features_per_block)
        self.grid = (WARP * blocks, features_per_block, 1)
        self.threadgroup = (WARP, features_per_block, 1)

    def kernel(self) -> Any:
        return _kernel()


def qmv_rows_reference(
    x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int
) -> mx.array:
    """``qmv_rows``'s arithmetic in MLX ops: per-lane partial sums along qmv's K order (in the
    activation type under 8 bits, else float), summed in float, then the warp's butterfly reduction."""
    dtype = x.dtype
    k, n = x.shape[-1], w.shape[0]
    ept = 16 if bits <= 4 else 8
    per_warp = WARP * ept
    ones = mx.ones(scales.shape, dtype=mx.float32)
    q = mx.dequantize(w, ones, mx.zeros_like(ones), group_size=group_size, bits=bits).astype(dtype)  # [N, K]
    groups = mx.repeat(mx.arange(k // group_size), group_size)
    w_dq = (q * scales.astype(dtype)[:, groups]).astype(dtype) + biases.astype(dtype)[:, groups]
    flat = x.reshape(-1, k)
    passes = k // per_warp
    rest = k - passes * per_warp
    float_sums = bits >= 8
    acc_dtype = mx.float32 if float_sums else dtype
    lanes = mx.zeros((flat.shape[0], n, WARP, ept), dtype=acc_dtype)

    def add(acc: mx.array, xs: mx.array, ws: mx.array) -> mx.array:
        # xs [R, 1, lanes, ept], ws [1, N, lanes, ept]
        product = xs.astype(mx.float32) * ws.astype(mx.float32)
        return (acc.astype(mx.float32) + product).astype(acc_dtype)

    for r in range(passes):
        cols = slice(r * per_warp, (r + 1) * per_warp)
        xs = flat[:, cols].reshape(-1, 1, WARP, ept)
        ws = w_dq[:, cols].reshape(1, n, WARP, ept)
        lanes = add(lanes, xs, ws)
    if rest:
        used = rest // ept  # lanes whose residue chunk lies inside K
        xs = flat[:, k - rest :].reshape(-1, 1, used, ept)
        ws = w_dq[:, k - rest :].reshape(1, n, used, ept)
        lanes = mx.concatenate([add(lanes[:, :, :used], xs, ws), lanes[:, :, used:]], axis=2)
    sums = mx.zeros(lanes.shape[:3], dtype=mx.float32)
    for j in range(ept):
        sums = sums + lanes[..., j].astype(mx.float32)
    return butterfly(sums).astype(dtype).reshape(*x.shape[:-1], n)
