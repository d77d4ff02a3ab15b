"""``qmv_rows`` on Metal: a w-row quantized matrix-vector product whose every row is MLX's one-row Metal product.

MLX's Metal quantized matmul runs ``qmv_fast`` for one row (``kernels/quantized.h``, ``qmv_fast_impl``) where
N is a multiple of 8 and K of the pass length (512 inputs for 4 bits, 256 for 8): two simdgroups of a
threadgroup, four output features each; lane ``t`` owns the ``VPT`` inputs ``t * VPT`` (+ j) of each pass over
K. Per pass a lane loads its inputs into float (``load_vector``: for 4 bits the j-th of each four divided by
16^j, their sum taken in the activation type T four at a time and added in float), then per feature takes the
dot with its packed weights masked in place (``qdot``: ``scale * accum + sum * bias``, in float) and adds it to
the feature's float result; a ``simd_sum`` over the 32 lanes ends it. Its cost grows with rows because each
row runs the whole kernel again (from 2 rows newer MLX versions run other kernels, whose rows are not those of
the one-row product).

``MetalQmvLauncher`` runs that arithmetic for up to ``MAX_ROWS`` rows in one launch: each pass's packed
weights, scales and biases are read once and the ``load_vector`` / ``qdot`` sequence runs for each row, so a row's
result does not depend on the other rows and equals MLX's one-row product wherever the compiler treats the
same expressions alike. There is no Mac here to check that: ``specbench.kernels.probe`` uses this kernel only
where the device's own probe finds every row bit-identical to MLX's one-row result.

``qmv_rows_metal_reference`` is the same arithmetic in MLX ops (any device), with the lanes' sums in one
fixed order where ``simd_sum`` has the hardware's: row-invariant by construction, close to, not equal to, the
kernel.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from specbench.kernels.jit import QuantizedRowsLauncher, butterfly, kernel_name

MAX_ROWS = 16
SIMD = 32
#: Output features per simdgroup and simdgroups per threadgroup, as in MLX's ``qmv_fast``.
FEATURES_PER_SIMDGROUP = 4
SIMDGROUPS = 2
BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
DTYPES = (mx.bfloat16, mx.float16)
#: The one variant: MLX's Metal arithmetic has no dequantized weights to round (``qdot`` masks in place).
VARIANT = "metal"


def metal_available() -> bool:
    """Whether MLX runs on Metal here."""
    metal = getattr(mx, "metal", None)
    return bool(metal is not None and metal.is_available() and mx.default_device().type == mx.DeviceType.gpu)


def values_per_thread(bits: int) -> int:
    """Inputs a lane owns per pass: two 32-bit packs."""
    return 2 * (32 // bits)


def supports(x: mx.array, n: int, bits: int, group_size: int, mode: str = "affine", biases: Any = True) -> bool:
    """Whether the Metal kernel computes this product as MLX's ``qmv_fast`` does: affine weights with biases (in the
    inputs' type: MLX computes in the promoted type of the two), 4 or 8 bits, group size 32/64/128, bfloat16 or
    float16 inputs, N a multiple of 8 and K of the pass length (MLX runs other kernels for other shapes, and for K
    of 64 or 128)."""
    k = x.shape[-1]
    return (
        mode == "affine"
        and biases is not None
        and getattr(biases, "dtype", x.dtype) == x.dtype
        and bits in BITS
        and group_size in GROUP_SIZES
        and x.dtype in DTYPES
        and n % (FEATURES_PER_SIMDGROUP * SIMDGROUPS) == 0
        and k % (SIMD * values_per_thread(bits)) == 0
        and k not in (64, 128)
    )


# Functions on thread arrays with MLX's expressions: ``load_vector`` and ``qdot`` of ``kernels/quantized.h``.
_HEADER = r"""
template <typename T, int VPT, int BITS>
inline float sb_load_vector(thread const T* x, thread float* x_thread) {
  float sum = 0;
  if (BITS == 4) {
    for (int i = 0; i < VPT; i += 4) {
      sum += x[i] + x[i + 1] + x[i + 2] + x[i + 3];
      x_thread[i] = x[i];
      x_thread[i + 1] = x[i + 1] / 16.0f;
      x_thread[i + 2] = x[i + 2] / 256.0f;
      x_thread[i + 3] = x[i + 3] / 4096.0f;
    }
  } else {
    for (int i = 0; i < VPT; i++) {
      sum += x[i];
      x_thread[i] = x[i];
    }
  }
  return sum;
}

template <int VPT, int BITS>
inline float sb_qdot(thread const uint32_t* packs, thread const float* x_thread, float scale, float bias, float sum) {
  thread const uint8_t* w = (thread const uint8_t*)packs;
  float accum = 0;
  if (BITS == 4) {
    for (int i = 0; i < (VPT / 4); i++) {
      uint16_t ws = as_type<ushort2>(packs[i >> 1])[i & 1];  // the i-th 16 bits, as MLX's uint16_t view reads them
      accum +=
          (x_thread[4 * i] * (ws & 0x000f) +
           x_thread[4 * i + 1] * (ws & 0x00f0) +
           x_thread[4 * i + 2] * (ws & 0x0f00) +
           x_thread[4 * i + 3] * (ws & 0xf000));
    }
  } else {
    for (int i = 0; i < VPT; i++) {
      accum += x_thread[i] * w[i];
    }
  }
  return scale * accum + sum * bias;
}
"""

# Template: T, BITS, GROUP, K, N, ROWS. One threadgroup = 2 simdgroups x 4 features, as qmv_fast lays them out.
_SOURCE = r"""
  constexpr int PF = 32 / BITS;
  constexpr int BYTES = 2 * 4;  // two 32-bit packs per lane and feature
  constexpr int VPT = 2 * PF;
  constexpr int BLOCK = VPT * 32;
  constexpr int SCALE_STEP = GROUP / VPT;
  constexpr int FEATURES = 4;
  constexpr int K_BYTES = K * 4 / PF;
  constexpr int K_GROUPS = K / GROUP;
  const int out_row = threadgroup_position_in_grid.y * (2 * FEATURES) + simdgroup_index_in_threadgroup * FEATURES;
  const int lane = thread_index_in_simdgroup;

  const device uint8_t* ws = (const device uint8_t*)w + out_row * K_BYTES + lane * BYTES;
  int sb = out_row * K_GROUPS + lane / SCALE_STEP;
  int xo = lane * VPT;

  float result[ROWS][FEATURES];
  for (int m = 0; m < ROWS; m++) {
    for (int f = 0; f < FEATURES; f++) {
      result[m][f] = 0;
    }
  }
  for (int k = 0; k < K; k += BLOCK) {
    uint32_t wq[FEATURES][2];
    float s[FEATURES];
    float b[FEATURES];
    for (int f = 0; f < FEATURES; f++) {
      const device uint32_t* packs = (const device uint32_t*)(ws + f * K_BYTES);
      wq[f][0] = packs[0];
      wq[f][1] = packs[1];
      s[f] = scales[sb + f * K_GROUPS];
      b[f] = biases[sb + f * K_GROUPS];
    }
    for (int m = 0; m < ROWS; m++) {
      T xv[VPT];
      for (int j = 0; j < VPT; j++) {
        xv[j] = x[m * K + xo + j];
      }
      float x_thread[VPT];
      float sum = sb_load_vector<T, VPT, BITS>(xv, x_thread);
      for (int f = 0; f < FEATURES; f++) {
        result[m][f] += sb_qdot<VPT, BITS>(wq[f], x_thread, s[f], b[f], sum);
      }
    }
    ws += BLOCK * 4 / PF;
    sb += BLOCK / GROUP;
    xo += BLOCK;
  }
  for (int m = 0; m < ROWS; m++) {
    for (int f = 0; f < FEATURES; f++) {
      float total = simd_sum(result[m][f]);
      if (lane == 0) {
        out[m * N + out_row + f] = static_cast<T>(total);
      }
    }
  }
"""


@functools.cache
def _kernel() -> Any:
    return mx.fast.metal_kernel(
        name=kernel_name("specbench_qmv_rows_metal", _HEADER, _SOURCE),
        input_names=["x", "w", "scales", "biases"],
        output_names=["out"],
        source=_SOURCE,
        header=_HEADER,
    )


class MetalQmvLauncher(QuantizedRowsLauncher):
    """The Metal kernel for one layer and activation type (``QuantizedRowsLauncher``)."""

    __slots__ = ()
    max_rows = MAX_ROWS

    def __init__(
        self, w: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int, dtype: mx.Dtype, k: int
    ) -> None:
        self.settle(w, scales, biases, dtype, k)
        self.template = [("T", dtype), ("BITS", bits), ("GROUP", group_size), ("K", k), ("N", self.n)]
        per_group = FEATURES_PER_SIMDGROUP * SIMDGROUPS
        self.grid = (SIMD, SIMDGROUPS * (self.n // per_group), 1)  # threads: one threadgroup per 8 features
        self.threadgroup = (SIMD, SIMDGROUPS, 1)

    def kernel(self) -> Any:
        return _kernel()


def qmv_rows_metal_reference(
    x: mx.array, w: mx.array, scales: mx.array, biases: mx.array, group_size: int, bits: int
) -> mx.array:
    """The Metal kernel's arithmetic in MLX ops: per lane and pass, the inputs' sum (in T four at a time for 4
    bits, added in float) and the dot with the integer weights in float, ``scale * accum + sum * bias``, added
    over the passes in order; then the lanes summed by a butterfly (``simd_sum``'s order is the hardware's)."""
    dtype = x.dtype
    k, n = x.shape[-1], w.shape[0]
    vpt = values_per_thread(bits)
    block = SIMD * vpt
    ones = mx.ones(scales.shape, dtype=mx.float32)
    q = mx.dequantize(w, ones, mx.zeros_like(ones), group_size=group_size, bits=bits)  # integer weights [N, K]
    flat = x.reshape(-1, k)
    rows = flat.shape[0]
    passes = k // block
    xs = flat.reshape(rows, 1, passes, SIMD, vpt)
    qs = q.reshape(1, n, passes, SIMD, vpt)
    # The group of lane t's chunk in pass p: (p * block + t * vpt) // group_size.
    starts = mx.arange(passes)[:, None] * block + mx.arange(SIMD)[None, :] * vpt
    groups = starts // group_size
    s = scales.astype(mx.float32)[:, groups][None]  # [1, N, passes, lanes]
    b = biases.astype(mx.float32)[:, groups][None]
    xf = xs.astype(mx.float32)
    if bits == 4:  # four at a time in T, then into the float sum
        quads = xs.reshape(rows, 1, passes, SIMD, vpt // 4, 4)
        in_t = ((quads[..., 0] + quads[..., 1]) + quads[..., 2]) + quads[..., 3]
        sums = mx.zeros((rows, 1, passes, SIMD), dtype=mx.float32)
        for i in range(vpt // 4):
            sums = sums + in_t[..., i].astype(mx.float32)
        products = (xf * qs).reshape(rows, n, passes, SIMD, vpt // 4, 4)
        accum = mx.zeros((rows, n, passes, SIMD), dtype=mx.float32)
        for i in range(vpt // 4):
            quad = products[..., i, :]
            accum = accum + (((quad[..., 0] + quad[..., 1]) + quad[..., 2]) + quad[..., 3])
    else:
        sums = mx.zeros((rows, 1, passes, SIMD), dtype=mx.float32)
        accum = mx.zeros((rows, n, passes, SIMD), dtype=mx.float32)
        for i in range(vpt):
            sums = sums + xf[..., i]
            accum = accum + xf[..., i] * qs[..., i]
    per_pass = s * accum + sums * b  # [rows, N, passes, lanes]
    lanes = mx.zeros((rows, n, SIMD), dtype=mx.float32)
    for p in range(passes):
        lanes = lanes + per_pass[:, :, p]
    return butterfly(lanes).astype(dtype).reshape(*x.shape[:-1], n)
