"""The KV-buffer layout of serial decoding, and whether the attention kernel depends on it.

A kernel can depend on the memory layout of the KV cache. On MLX's CUDA backend (cuDNN's
decoding attention) a single query over n >= 256 keys that are a slice of a cache buffer gives
a result that depends on the buffer's length and on the rows after the n it attends (measured
on an H200: scripts/gpu/exact_diagnose.py). Serial decoding grows the buffer in whole steps of
256 rows and has written nothing past the current token; a verification that crosses a step
grows it to ``offset + 256``, writes w rows at once, and a rollback leaves rejected rows behind.
Exact mode therefore gives the caches the buffer serial decoding would have
(``serial_kv_layout``), each split attention row but the last attends to a copy of its keys in
a buffer of its serial length with zeros after them (``serial_kv_rows``), and exact
verification zeros rejected rows (``clear_rejected``). A token tree's split attention gives each row its keys
in the contiguous buffer serial decoding along the row's path attends (``tree_attention``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache, QuantizedKVCache

#: The environment variable with which MLX's CUDA backend turns cuDNN's attention off ("0").
#: Importing specbench sets it to "0" unless it is set (specbench/__init__.py).
CUDNN_ATTENTION_ENV = "MLX_CUDA_USE_CUDNN_SDPA"


def cache_length(cache: Sequence[Any]) -> int:
    """Tokens the caches hold (the first cache with an offset)."""
    return next((int(c.offset) for c in cache if hasattr(c, "offset")), 0)


def cudnn_attention() -> bool:
    """Whether decoding attention may run through cuDNN: MLX's CUDA backend on the default
    device, with ``MLX_CUDA_USE_CUDNN_SDPA`` not set to "0" (MLX reads it when it first runs
    attention, so set it before that), on a device MLX runs cuDNN's attention on (compute capability 8 or
    later, as ``mx.device_info()`` reports it)."""
    cuda = getattr(mx, "cuda", None)
    if mx.default_device().type != mx.DeviceType.gpu or cuda is None or not cuda.is_available():
        return False
    major = mx.device_info().get("compute_capability_major")
    return os.environ.get(CUDNN_ATTENTION_ENV, "1") != "0" and not (isinstance(major, int) and major < 8)


def layout_sensitive_attention() -> bool:
    """Whether a decoding attention's result depends on the KV buffer around the keys it
    attends (its length, the rows after them): cuDNN's, on CUDA. MLX's own kernels (Metal,
    CUDA with cuDNN off, CPU) read exactly the keys they attend."""
    return cudnn_attention()


def serial_extent(keys: int, step: int = KVCache.step) -> int:
    """The buffer length of an mlx-lm ``KVCache`` holding ``keys`` keys after serial decoding
    (and after a prefill): it grows in whole steps."""
    return step * ((keys + step - 1) // step)


def with_extent(x: mx.array, n: int, extent: int) -> mx.array:
    """A fresh ``[..., extent, D]`` buffer holding ``x[..., :n, :]`` (zeros after)."""
    rows = x[..., :n, :]
    if extent == n:
        return mx.contiguous(rows)
    pad = mx.zeros((*x.shape[:-2], extent - n, x.shape[-1]), dtype=x.dtype)
    return mx.concatenate([rows, pad], axis=-2)


def serial_kv_layout(cache: Sequence[Any] | None, width: int = 1) -> int | None:
    """Give each mlx-lm ``KVCache`` in ``cache`` the buffer serial decoding has after ``width``
    more tokens: ``256 * ceil((offset + width) / 256)`` rows (a copy when it differs, which after
    the first call happens only when a forward crosses a buffer step or a rollback goes back
    across one). Returns that length when every attention cache is such a ``KVCache`` (then the
    split attention knows the layout of its keys), else None.

    A verification that crosses a step boundary otherwise grows the buffer to ``offset + 256``
    rows, and kernels that choose by the layout of the keys (cuDNN decoding attention on CUDA)
    then compute later steps differently than serial decoding does.
    """
    extents: set[int] = set()
    others = False
    for c in cache or ():
        if type(c) is not KVCache:
            others |= hasattr(c, "keys") and not isinstance(c, QuantizedKVCache)
            continue
        if c.keys is None:
            continue
        target = serial_extent(c.offset + width, c.step)
        if c.keys.shape[2] != target:
            c.keys = with_extent(c.keys, c.offset, target)
            c.values = with_extent(c.values, c.offset, target)
        extents.add(target)
    return extents.pop() if len(extents) == 1 and not others else None


def batch_starts(cache: Sequence[Any] | None) -> list[int] | None:
    """Each batch row's first key in mlx-lm ``BatchKVCache`` layers (their left padding, the same in every layer);
    None for a single request's caches."""
    for c in cache or ():
        if isinstance(c, BatchKVCache):
            return [int(s) for s in c.left_padding.tolist()]  # type: ignore[union-attr]
    return None


def serial_kv_rows(
    keys: mx.array, values: mx.array, n: int, extent: int | None, layout_sensitive: bool
) -> tuple[mx.array, mx.array]:
    """Keys and values ``[..., :n, :]`` laid out as a serial step attending ``n`` keys sees them.

    ``extent``: the length of the buffers ``keys`` and ``values`` are slices of (None: unknown,
    then they are sliced as they are). Where attention is ``layout_sensitive``: in a buffer of the
    serial length whose rows after ``n`` are zeros (a serial step has not written them yet;
    cuDNN's decoding attention reads past the keys it attends, so the later rows of a
    verification would change the result).
    """
    serial = serial_extent(n)
    if extent is None or (serial == extent and (n == keys.shape[-2] or not layout_sensitive)):
        return keys[..., :n, :], values[..., :n, :]
    return with_extent(keys, n, serial)[..., :n, :], with_extent(values, n, serial)[..., :n, :]


def clear_rejected(cache: Sequence[Any], count: int) -> None:
    """Zero the ``count`` rows after each ``KVCache``'s offset (just trimmed): the buffer then
    holds what serial decoding's holds, zeros past the current token."""
    for c in cache:
        if type(c) is KVCache and c.keys is not None and count > 0:
            start, stop = c.offset, min(c.offset + count, c.keys.shape[2])
            if stop > start:
                c.keys[..., start:stop, :] = 0
                c.values[..., start:stop, :] = 0


def tree_attention(
    original: Callable,
    queries,
    keys,
    values,
    visible: list[list[int]],
    scale: float,
    layout_sensitive: bool,
    *args,
    **kwargs,
):
    """A token tree's attention (``original``: the attention op) row by row: row i (its ``visible`` nodes) attends
    the cache and its ancestors' keys, gathered into the contiguous buffer serial decoding along its path attends."""
    rows = queries.shape[-2]
    prefix = keys.shape[-2] - rows
    outs = []
    for i in range(rows):
        at = mx.array([prefix + j for j in visible[i]], dtype=mx.int32)
        row_keys = mx.concatenate([keys[..., :prefix, :], keys[..., at, :]], axis=-2)
        row_values = mx.concatenate([values[..., :prefix, :], values[..., at, :]], axis=-2)
        n = row_keys.shape[-2]
        row_keys, row_values = serial_kv_rows(row_keys, row_values, n, n, layout_sensitive)
        outs.append(
            original(mx.contiguous(queries[..., i : i + 1, :]), row_keys, row_values, *args, scale=scale, **kwargs)
        )
    return mx.concatenate(outs, axis=-2)
