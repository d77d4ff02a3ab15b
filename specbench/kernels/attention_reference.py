"""``attention_rows``'s arithmetic in MLX ops (any device): ``attention_rows_reference``.

Per row: its key count's pass plan, the lanes' chains and butterfly sums, the online softmax per warp,
the first pass's block merge and the 32-slot merge, as ``specbench.kernels.attention`` describes. Its
multiply-adds round twice and its ``exp2`` is MLX's, so it is row-invariant by construction (no
reduction runs over rows) and close to, not equal to, the kernel.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from specbench.kernels.attention import (
    SLOTS,
    WARP,
    WARPS_PER_BLOCK,
    _passes,
    check_inputs,
    row_keys,
    scale_log2,
)
from specbench.kernels.jit import butterfly


def _exp2(x: mx.array) -> mx.array:
    return mx.power(mx.array(2.0, dtype=mx.float32), x)


def _scan_reference(q: mx.array, keys: mx.array, values: mx.array, counts: list[int], stride: int):
    """Per row and warp ``v`` of ``stride``: the online softmax over keys ``v, v + stride, ...`` below the
    row's count. q [B, H, R, D] (scaled, float); keys and values [B, H, N, D] (float). Returns the running
    max and sum [B, H, R, stride] and output [B, H, R, stride, D]."""
    b, h, r, d = q.shape
    vpt = d // WARP
    finite_min = float(np.finfo(np.float32).min)
    m = mx.full((b, h, r, stride), finite_min, dtype=mx.float32)
    s = mx.zeros((b, h, r, stride), dtype=mx.float32)
    o = mx.zeros((b, h, r, stride, d), dtype=mx.float32)
    limit = mx.array(counts)[:, None]  # [R, 1]
    for base in range(0, max(counts), stride):
        idx = base + mx.arange(stride)  # the key each warp reads at this step
        valid = idx[None, :] < limit  # [R, stride]
        safe = mx.minimum(idx, keys.shape[2] - 1)
        k = keys[:, :, safe]  # [B, H, stride, D]
        v = values[:, :, safe]
        lanes = (q[:, :, :, None, :] * k[:, :, None]).reshape(b, h, r, stride, WARP, vpt)
        partial = lanes[..., 0]
        for j in range(1, vpt):
            partial = partial + lanes[..., j]
        score = butterfly(partial, mx.add)  # [B, H, R, stride]
        new_max = mx.maximum(m, score)
        factor = _exp2(m - new_max)
        e = _exp2(score - new_max)
        s = mx.where(valid, s * factor + e, s)
        o = mx.where(valid[..., None], o * factor[..., None] + e[..., None] * v[:, :, None], o)
        m = mx.where(valid, new_max, m)
    return m, s, o


def _merge_reference(m: mx.array, s: mx.array, o: mx.array) -> mx.array:
    """MLX's merge of 32 slots: m, s [..., 32], o [..., 32, D] -> [..., D]."""
    new_max = butterfly(m, mx.maximum)
    factor = _exp2(m - new_max[..., None])
    total = butterfly(s * factor, mx.add)
    inverse = mx.where(total == 0, mx.zeros_like(total), 1.0 / mx.where(total == 0, 1.0, total))
    scaled = o * factor[..., None]  # [..., 32 slots, D]
    summed = butterfly(mx.swapaxes(scaled, -1, -2), mx.add)  # the slots are the lanes: [..., D]
    return summed * inverse[..., None]


def attention_rows_reference(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    scale: float,
    mask: str | None = None,
    starts: list[int] | None = None,
) -> mx.array:
    """``attention_rows``'s arithmetic in MLX ops: per row, its key count's pass plan, lane chains and
    butterfly sums, online softmax per warp, the first pass's block merge and the 32-slot merge.
    ``starts``: batch row b attends keys from ``starts[b]`` on (each batch row then runs on its own)."""
    reason = check_inputs(queries, keys, values, mask, starts)
    if reason is not None:
        raise ValueError(f"attention_rows_reference: {reason}")
    if starts is not None:
        per_row = [
            attention_rows_reference(queries[i : i + 1], keys[i : i + 1, :, s:], values[i : i + 1, :, s:], scale, mask)
            for i, s in enumerate(starts)
        ]
        return mx.concatenate(per_row, axis=0)
    b, heads, rows, d = queries.shape
    kv_heads, n_keys = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    causal = rows == 1 or mask == "causal"
    k_all = mx.repeat(keys.astype(mx.float32), group, axis=1)
    v_all = mx.repeat(values.astype(mx.float32), group, axis=1)
    counts = row_keys(rows, n_keys, causal)
    parts = []
    for start, stop, two_pass in _passes(rows, n_keys, causal):
        q = queries[:, :, start:stop].astype(mx.float32) * scale_log2(scale, two_pass)
        stride = WARPS_PER_BLOCK * SLOTS if two_pass else SLOTS
        m, s, o = _scan_reference(q, k_all, v_all, counts[start:stop], stride)
        if two_pass:  # each block's 8 warps: [..., 32 blocks, 8 warps]
            m = m.reshape(*m.shape[:-1], SLOTS, WARPS_PER_BLOCK)
            s = s.reshape(*s.shape[:-1], SLOTS, WARPS_PER_BLOCK)
            o = o.reshape(*o.shape[:-2], SLOTS, WARPS_PER_BLOCK, d)
            pad = (*m.shape[:-1], WARP - WARPS_PER_BLOCK)  # lanes past the block's warps: -1e9 and 0
            lanes_m = mx.concatenate([m, mx.full(pad, -1e9, dtype=mx.float32)], axis=-1)
            lanes_s = mx.concatenate([s, mx.zeros(pad, dtype=mx.float32)], axis=-1)
            block_max = butterfly(lanes_m, mx.maximum)
            block_sum = butterfly(lanes_s * _exp2(lanes_m - block_max[..., None]), mx.add)
            ff = _exp2(m - block_max[..., None])
            scaled = o * ff[..., None]
            block_o = scaled[..., 0, :]
            for j in range(1, WARPS_PER_BLOCK):
                block_o = block_o + scaled[..., j, :]
            m, s, o = block_max, block_sum, block_o
        parts.append(_merge_reference(m, s, o).astype(queries.dtype))
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)
