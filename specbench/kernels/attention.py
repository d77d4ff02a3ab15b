"""Attention of w query rows over the KV cache whose every row is MLX's one-query attention, bit for bit.

With cuDNN's attention off (specbench sets ``MLX_CUDA_USE_CUDNN_SDPA=0``), MLX's CUDA backend runs one
query over ``n`` keys through ``sdpa_vector`` (``scaled_dot_product_attention.cu``), float throughout:

- the query is read as ``scale * log2(e) * q`` (the factor rounded from a double product in the
  single-pass kernel, from a float one in the two-pass kernel);
- ``n <= 1024``, single pass: 32 warps, warp ``v`` owning keys ``v, v + 32, ...``; ``n > 1024``, two
  passes: 32 blocks of 8 warps, warp ``v`` (0..255) owning keys ``v, v + 256, ...``;
- per key a lane's ``D / 32`` contiguous elements give a fused multiply-add chain, summed over the warp
  by ``cg::reduce``; then the online softmax ``m' = max(m, s)``, ``f = exp2(m - m')``,
  ``e = exp2(s - m')``, ``l = l * f + e``, ``o = o * f + e * v``;
- the two-pass kernel first merges its 8 warps per block (a sequential sum of ``o * exp2(m - m')``);
  then 32 slots (warps, or blocks) are merged: max and rescaled sums over the warp, the outputs
  transposed through shared memory, rescaled, summed by ``cg::reduce`` and multiplied by
  ``__frcp_rn`` of the sum.

``attention_rows`` runs exactly this per query row, for up to ``MAX_ROWS`` rows of a causal block (row
``i`` of ``w`` attends the first ``n - w + i + 1`` keys) and every query head of a KV head at once: a
warp loads each key and value once and updates the state of every (row, head) it serves, each with the
arithmetic and key order of that row's own one-query call (its key count picks single or two passes).
A scan kernel writes each row's 32 slots, a merge kernel reduces them as MLX does. So a row's result
does not depend on the other rows and equals MLX's one-query result wherever the compiler contracts
the products as MLX's build does; which ``variant`` of the contraction that is, is for the device's
probe to find (``specbench.kernels.probe``).

``attention_rows_reference`` (``specbench.kernels.attention_reference``) is the same arithmetic in MLX ops.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx
import numpy as np

from specbench.kernels.jit import kernel_name

#: Query rows one call computes (the probe proves 1..MAX_ROWS).
MAX_ROWS = 16
HEAD_DIMS = (64, 128)
DTYPES = (mx.bfloat16, mx.float16)
#: MLX's single-pass kernel serves up to this many keys; more run in two passes.
SINGLE_PASS_KEYS = 1024
WARP = 32
#: Slots the merge reduces: the single pass's 32 warps, or the two passes' 32 blocks.
SLOTS = 32
#: Warps per scan block (the two-pass kernel's warps per block).
WARPS_PER_BLOCK = 8
#: How ``o * f + e * v`` (and ``l * f + e``, and the score's chain) are contracted: "source" writes them
#: as MLX's source does (the compiler decides), "fma-o" is ``fma(o, f, e * v)``, "fma-v" ``fma(e, v, o * f)``.
VARIANTS = ("source", "fma-o", "fma-v")
#: MLX's ``M_LOG2E`` (a double) and the two-pass kernel's float literal ``1.44269504089f``.
_LOG2E = 1.4426950408889634074
_LOG2E_FLOAT = np.float32(1.44269504089)

_HEADER = r"""
#include <cooperative_groups/reduce.h>

namespace specbench_attention {

template <int VARIANT>
__device__ __forceinline__ float chain(float q, float k, float score) {
  if constexpr (VARIANT == 0) { score += q * k; return score; }
  else { return fmaf(q, k, score); }
}

template <int VARIANT>
__device__ __forceinline__ float rescale_sum(float sum, float factor, float e) {
  if constexpr (VARIANT == 0) { return sum * factor + e; }
  else { return fmaf(sum, factor, e); }
}

template <int VARIANT>
__device__ __forceinline__ float rescale_out(float o, float factor, float e, float v) {
  if constexpr (VARIANT == 0) { return o * factor + e * v; }
  else if constexpr (VARIANT == 1) { return fmaf(o, factor, e * v); }
  else { return fmaf(e, v, o * factor); }
}

}  // namespace specbench_attention
"""

# The scan: template constants T, D, TWO_PASS, QV (query vectors per warp), VARIANT. Inputs queries
# [B, H, L, D], keys and values [B, Hkv, N, D] (any strides), scale [1] (scale * log2 e as the kernel
# rounds it), starts [B] (batch row b attends keys from starts[b] on: mlx-lm's left padding). Outputs per query
# vector q = (b * H + h) * L + row and slot: partials [Q, 32, D], maxs and sums [Q, 32]. Block (blockIdx.x,
# chunk of query vectors, b * Hkv + kv head), 8 warps; warp v = blockIdx.x * 8 + warp owns keys v, v + STRIDE,
# ... (after the row's start) for every query vector of the chunk (t = row * group + g).
_SCAN = r"""
  namespace sa = specbench_attention;
  constexpr int VPT = D / 32;
  constexpr int WARPS = 8;
  constexpr int STRIDE = TWO_PASS ? 256 : 32;
  auto block = cg::this_thread_block();
  auto warp = cg::tiled_partition<32>(block);
  const int lane = warp.thread_rank();
  const int warp_idx = warp.meta_group_rank();
  const int heads = queries_shape[1];
  const int rows = queries_shape[2];
  const int kv_heads = keys_shape[1];
  const int n_keys = keys_shape[2];
  const int group = heads / kv_heads;
  const int batch = blockIdx.z / kv_heads;
  const int kv_head = blockIdx.z % kv_heads;
  const int vw = blockIdx.x * WARPS + warp_idx;
  const int first = blockIdx.y * QV;
  const int count = rows * group;
  const float scale_log2 = scale[0];
  const int start = starts[batch];  // the batch row's first key (its left padding)

  float q[QV][VPT];
  float o[QV][VPT];
  float m[QV];
  float s[QV];
  int n[QV];
  int n_max = 0;
  #pragma unroll
  for (int c = 0; c < QV; ++c) {
    const int t = first + c;
    const int row = t / group;
    const int head = kv_head * group + t % group;
    n[c] = t < count ? (CAUSAL ? n_keys - rows + row + 1 : n_keys) - start : 0;
    n_max = n[c] > n_max ? n[c] : n_max;
    #pragma unroll
    for (int j = 0; j < VPT; ++j) {
      float x = 0.0f;
      if (t < count) {
        x = static_cast<float>(queries[batch * queries_strides[0] + head * queries_strides[1] +
                                       row * queries_strides[2] + (VPT * lane + j) * queries_strides[3]]);
      }
      q[c][j] = scale_log2 * x;
      o[c][j] = 0.0f;
    }
    m[c] = Limits<float>::finite_min();
    s[c] = 0.0f;
  }

  const T* kp = keys + batch * keys_strides[0] + kv_head * keys_strides[1] + (int64_t)start * keys_strides[2] +
               (VPT * lane) * keys_strides[3];
  const T* vp = values + batch * values_strides[0] + kv_head * values_strides[1] +
               (int64_t)start * values_strides[2] + (VPT * lane) * values_strides[3];
  for (int i = vw; i < n_max; i += STRIDE) {
    float k[VPT];
    float v[VPT];
    #pragma unroll
    for (int j = 0; j < VPT; ++j) {
      k[j] = static_cast<float>(kp[i * keys_strides[2] + j * keys_strides[3]]);
      v[j] = static_cast<float>(vp[i * values_strides[2] + j * values_strides[3]]);
    }
    #pragma unroll
    for (int c = 0; c < QV; ++c) {
      if (i < n[c]) {
        float score = 0.0f;
        #pragma unroll
        for (int j = 0; j < VPT; ++j) {
          score = sa::chain<VARIANT>(q[c][j], k[j], score);
        }
        score = cg::reduce(warp, score, cg::plus<float>());
        const float new_max = fmaxf(m[c], score);
        const float factor = exp2f(m[c] - new_max);
        const float e = exp2f(score - new_max);
        m[c] = new_max;
        s[c] = sa::rescale_sum<VARIANT>(s[c], factor, e);
        #pragma unroll
        for (int j = 0; j < VPT; ++j) {
          o[c][j] = sa::rescale_out<VARIANT>(o[c][j], factor, e, v[j]);
        }
      }
    }
  }

  if constexpr (!TWO_PASS) {
    #pragma unroll
    for (int c = 0; c < QV; ++c) {
      const int t = first + c;
      if (t < count) {
        const int64_t qv = ((int64_t)batch * heads + kv_head * group + t % group) * rows + t / group;
        const int64_t slot = qv * 32 + vw;
        if (lane == 0) {
          maxs[slot] = m[c];
          sums[slot] = s[c];
        }
        #pragma unroll
        for (int j = 0; j < VPT; ++j) {
          partials[slot * D + VPT * lane + j] = o[c][j];
        }
      }
    }
  } else {
    // MLX's first pass merges its block's 8 warps: max and rescaled sum over the warp, then the
    // outputs rescaled by each warp and summed in warp order.
    __shared__ float outputs[WARPS][32 + 1];
    __shared__ float max_scores[WARPS];
    __shared__ float sum_scores[WARPS];
    #pragma unroll
    for (int c = 0; c < QV; ++c) {
      const int t = first + c;
      if (t >= count) {
        break;  // the same for the whole block
      }
      if (lane == 0) {
        max_scores[warp_idx] = m[c];
        sum_scores[warp_idx] = s[c];
      }
      block.sync();
      const float ms = lane < WARPS ? max_scores[lane] : -1e9f;
      const float new_max = cg::reduce(warp, ms, cg::greater<float>());
      const float factor = exp2f(ms - new_max);
      float ss = lane < WARPS ? sum_scores[lane] : 0.0f;
      ss = cg::reduce(warp, ss * factor, cg::plus<float>());
      const int64_t qv = ((int64_t)batch * heads + kv_head * group + t % group) * rows + t / group;
      const int64_t slot = qv * 32 + blockIdx.x;
      if (warp_idx == 0 && lane == 0) {
        sums[slot] = ss;
        maxs[slot] = new_max;
      }
      const float ff = exp2f(max_scores[warp_idx] - new_max);
      #pragma unroll
      for (int i = 0; i < VPT; ++i) {
        outputs[warp_idx][lane] = o[c][i] * ff;
        block.sync();
        if (warp_idx == 0) {
          float ot = outputs[0][lane];
          #pragma unroll
          for (int j = 1; j < WARPS; ++j) {
            ot += outputs[j][lane];
          }
          o[c][i] = ot;
        }
        block.sync();
      }
      if (warp_idx == 0) {
        #pragma unroll
        for (int i = 0; i < VPT; ++i) {
          partials[slot * D + VPT * lane + i] = o[c][i];
        }
      }
    }
  }
"""

# The merge, MLX's last step for one query: template constants T, D. Inputs partials [Q, 32, D], maxs and
# sums [Q, 32]; output out [Q, D]. One block of 32 warps per query vector.
_MERGE = r"""
  constexpr int VPT = D / 32;
  __shared__ float outputs[32][32 + 1];
  auto block = cg::this_thread_block();
  auto warp = cg::tiled_partition<32>(block);
  const int lane = warp.thread_rank();
  const int warp_idx = warp.meta_group_rank();
  const int64_t qv = blockIdx.x;

  const float max_score = maxs[qv * 32 + lane];
  const float new_max = cg::reduce(warp, max_score, cg::greater<float>());
  const float factor = exp2f(max_score - new_max);
  float sum_exp_score = cg::reduce(warp, sums[qv * 32 + lane] * factor, cg::plus<float>());
  sum_exp_score = sum_exp_score == 0 ? 0 : __frcp_rn(sum_exp_score);

  float o[VPT];
  #pragma unroll
  for (int i = 0; i < VPT; ++i) {
    o[i] = partials[(qv * 32 + warp_idx) * D + VPT * lane + i];
  }
  #pragma unroll
  for (int i = 0; i < VPT; ++i) {
    outputs[lane][warp_idx] = o[i];
    block.sync();
    const float ot = outputs[warp_idx][lane] * factor;
    o[i] = cg::reduce(warp, ot, cg::plus<float>()) * sum_exp_score;
    block.sync();
  }
  if (lane == 0) {
    #pragma unroll
    for (int i = 0; i < VPT; ++i) {
      out[qv * D + VPT * warp_idx + i] = static_cast<T>(o[i]);
    }
  }
"""


def _dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).split(".")[-1]


def check_inputs(
    queries: mx.array, keys: mx.array, values: mx.array, mask: Any = None, starts: list[int] | None = None
) -> str | None:
    """Why ``attention_rows`` does not compute this attention (None: it does)."""
    if queries.ndim != 4 or keys.ndim != 4 or values.ndim != 4:
        return f"queries, keys and values are [B, heads, rows, D]; got {queries.shape}, {keys.shape}, {values.shape}"
    b, heads, rows, d = queries.shape
    if keys.shape != values.shape or keys.shape[0] != b or keys.shape[3] != d:
        return (
            f"keys and values [B, kv heads, keys, D] must match the queries {queries.shape}; "
            f"got {keys.shape}, {values.shape}"
        )
    if d not in HEAD_DIMS:
        return f"head dimension {d} is not one of {HEAD_DIMS}"
    if not queries.dtype == keys.dtype == values.dtype or queries.dtype not in DTYPES:
        names = [_dtype_name(t) for t in DTYPES]
        return f"dtypes must be one of {names}, all alike; got {queries.dtype}, {keys.dtype}, {values.dtype}"
    if heads % keys.shape[1]:
        return f"{heads} query heads are not a multiple of {keys.shape[1]} KV heads"
    if not 1 <= rows <= MAX_ROWS:
        return f"{rows} query rows: 1 to {MAX_ROWS} are computed"
    if not (mask is None or (isinstance(mask, str) and mask == "causal")):
        return "the mask must be None or 'causal' (array masks are not computed)"
    if keys.shape[2] < rows:
        return f"{rows} query rows need at least as many keys, got {keys.shape[2]}"
    if starts is not None:
        if len(starts) != b or not all(0 <= s <= keys.shape[2] - rows for s in starts):
            return f"starts {starts} must give each of the {b} batch rows a first key leaving {rows} keys or more"
        causal = rows == 1 or mask == "causal"
        if len({tuple(_passes(rows, keys.shape[2] - s, causal)) for s in starts}) > 1:
            return "the batch rows' key counts straddle the two-pass threshold (one launch runs one pass plan)"
    return None


def supports(
    queries: mx.array, keys: mx.array, values: mx.array, mask: Any = None, starts: list[int] | None = None
) -> bool:
    """Whether ``attention_rows`` computes this attention: [B, H, rows, D] queries with rows <= MAX_ROWS
    over [B, Hkv, N, D] keys and values (Hkv dividing H), D in HEAD_DIMS, bfloat16 or float16, mask None
    or "causal"; ``starts`` (one first key per batch row) with every row's key count on one side of the
    two-pass threshold."""
    return check_inputs(queries, keys, values, mask, starts) is None


def scale_log2(scale: float, two_pass: bool) -> float:
    """``scale * log2(e)`` as MLX's kernel rounds it: the single pass multiplies the float scale by the
    double ``M_LOG2E``, the two-pass kernel by the float literal ``1.44269504089f``."""
    s = np.float32(scale)
    if two_pass:
        return float(s * _LOG2E_FLOAT)
    return float(np.float32(np.float64(s) * np.float64(_LOG2E)))


def row_keys(rows: int, n_keys: int, causal: bool) -> list[int]:
    """Keys each query row attends: all ``n_keys``, or in a causal block ``n_keys - rows + i + 1`` for row i."""
    return [n_keys - rows + i + 1 if causal else n_keys for i in range(rows)]


def _passes(rows: int, n_keys: int, causal: bool) -> list[tuple[int, int, bool]]:
    """The rows ``[start, stop)`` that MLX serves in one pass (False) or two (True), in row order."""
    counts = row_keys(rows, n_keys, causal)
    single = sum(n <= SINGLE_PASS_KEYS for n in counts)
    groups = [(0, single, False), (single, rows, True)]
    return [(a, b, two) for a, b, two in groups if b > a]


@functools.cache
def _kernels() -> tuple[Any, Any]:
    scan = mx.fast.cuda_kernel(
        name=kernel_name("specbench_attention_scan", _HEADER, _SCAN),
        input_names=["queries", "keys", "values", "scale", "starts"],
        output_names=["partials", "maxs", "sums"],
        source=_SCAN,
        header=_HEADER,
        ensure_row_contiguous=False,
    )
    merge = mx.fast.cuda_kernel(
        name=kernel_name("specbench_attention_merge", _HEADER, _MERGE),
        input_names=["partials", "maxs", "sums"],
        output_names=["out"],
        source=_MERGE,
        header=_HEADER,
    )
    return scan, merge


@functools.cache
def _scale_array(scale: float, two_pass: bool) -> mx.array:
    return mx.array([scale_log2(scale, two_pass)], dtype=mx.float32)


def default_vectors_per_warp(head_dim: int) -> int:
    """(row, head) pairs one warp serves per key load: 4 at D = 128, 8 at D = 64 (about 100 registers,
    two 8-warp blocks per SM on an H200); more share each load further but lower occupancy."""
    return 4 if head_dim > 64 else 8


def attention_rows(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    scale: float,
    mask: str | None = None,
    variant: str = "source",
    vectors_per_warp: int | None = None,
    starts: list[int] | None = None,
) -> mx.array:
    """``mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)`` with every
    row computed as MLX's one-query attention over the keys that row attends (CUDA; see the module
    docstring). ``mask``: None (every row attends every key; what mlx-lm passes for one query) or
    "causal" (row i of w attends the first ``N - w + i + 1`` keys). ``vectors_per_warp``: (row, head)
    pairs per warp (``default_vectors_per_warp``); it changes the speed, never a row's arithmetic.
    ``starts``: batch row b attends keys from ``starts[b]`` on (mlx-lm's ``BatchKVCache`` left padding), as
    its own one-query call over ``keys[b, :, starts[b]:n]`` (no mask) computes it; default 0 for every row."""
    reason = check_inputs(queries, keys, values, mask, starts)
    if reason is not None:
        raise ValueError(f"attention_rows: {reason}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown attention_rows variant {variant!r}: use one of {VARIANTS}")
    b, heads, rows, d = queries.shape
    kv_heads, n_keys = keys.shape[1], keys.shape[2]
    causal = rows == 1 or mask == "causal"  # one row: its causal block attends every key
    group = heads // kv_heads
    qv_per_warp = vectors_per_warp or default_vectors_per_warp(d)
    scan, merge = _kernels()
    first = mx.array(starts or [0] * b, dtype=mx.int32)
    parts = []
    for start, stop, two_pass in _passes(rows, n_keys - (starts[0] if starts else 0), causal):
        q = queries if (start, stop) == (0, rows) else queries[:, :, start:stop]
        n = n_keys - (rows - stop) if causal else n_keys
        k, v = (keys, values) if n == n_keys else (keys[:, :, :n], values[:, :, :n])
        m = stop - start
        vectors = b * heads * m
        chunks = -(-(m * group) // qv_per_warp)
        partials, maxs, sums = scan(
            inputs=[q, k, v, _scale_array(float(scale), two_pass), first],
            template=[
                ("T", queries.dtype),
                ("D", d),
                ("TWO_PASS", two_pass),
                ("CAUSAL", causal),
                ("QV", qv_per_warp),
                ("VARIANT", VARIANTS.index(variant)),
            ],
            grid=(WARP * (WARPS_PER_BLOCK * SLOTS if two_pass else SLOTS), chunks, b * kv_heads),
            threadgroup=(WARP * WARPS_PER_BLOCK, 1, 1),
            output_shapes=[(vectors, SLOTS, d), (vectors, SLOTS), (vectors, SLOTS)],
            output_dtypes=[mx.float32, mx.float32, mx.float32],
        )
        (out,) = merge(
            inputs=[partials, maxs, sums],
            template=[("T", queries.dtype), ("D", d)],
            grid=(WARP * WARP * vectors, 1, 1),
            threadgroup=(WARP * WARP, 1, 1),
            output_shapes=[(vectors, d)],
            output_dtypes=[queries.dtype],
        )
        parts.append(out.reshape(b, heads, m, d))
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)
