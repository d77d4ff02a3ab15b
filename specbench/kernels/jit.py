"""What the kernels share: their names (MLX keeps compiled custom kernels by name) and their launch in row blocks."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import mlx.core as mx


def kernel_name(base: str, *sources: str) -> str:
    """``base`` and a digest of the kernel's source texts, as the kernel's name.

    MLX keeps a compiled custom kernel on disk under its name and template arguments alone
    (``$MLX_PTX_CACHE_DIR``, by default ``<temporary folder>/mlx/<version>/ptx``) and loads it from there
    in later processes, so a kernel whose source changed under the same name would run its old machine code.
    """
    return f"{base}_{hashlib.sha1(''.join(sources).encode()).hexdigest()[:10]}"


def butterfly(x: mx.array, op: Callable[[mx.array, mx.array], mx.array] = mx.add) -> mx.array:
    """A warp's reduction over the last axis (32 lanes), as ``cg::reduce`` runs it: ``x = op(x, x[lane ^ mask])``
    for masks 16, 8, 4, 2, 1; lane 0's result."""
    mask = 16
    while mask:
        x = op(x, x[..., mx.array([t ^ mask for t in range(32)])])
        mask //= 2
    return x[..., 0]


def launch_in_row_blocks(
    kernel: Any,
    x: mx.array,
    n: int,
    operands: list[mx.array],
    template: list[tuple[str, Any]],
    grid: tuple[int, int, int],
    threadgroup: tuple[int, int, int],
    max_rows: int,
) -> mx.array:
    """``kernel`` over the rows of ``x`` (any leading axes, K last) in launches of at most ``max_rows`` rows (its
    template gets ``ROWS``), ``operands`` after the rows; the [..., n] result in ``x``'s dtype."""
    k = x.shape[-1]
    flat = x if x.ndim == 2 else x.reshape(-1, k)
    rows = flat.shape[0]
    parts = []
    for start in range(0, rows, max_rows):
        chunk = flat if rows <= max_rows else flat[start : start + max_rows]  # no slice op for one launch
        m = chunk.shape[0]
        (out,) = kernel(
            inputs=[chunk, *operands],
            template=[*template, ("ROWS", m)],
            grid=grid,
            threadgroup=threadgroup,
            output_shapes=[(m, n)],
            output_dtypes=[x.dtype],
        )
        parts.append(out)
    out = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)
    return out if x.ndim == 2 else out.reshape(*x.shape[:-1], n)


class QuantizedRowsLauncher:
    """A row-invariant quantized product for one layer and activation type, with what does not depend on ``x``
    settled once: the weights' scales and biases in the activation type (``settle``), and the template and the grid
    (set by the backend's subclass, with its ``kernel``). Calling it builds one kernel call per ``max_rows`` rows
    and nothing else, so that a verify forward's many calls cost little on the host."""

    __slots__ = ("w", "scales", "biases", "n", "k", "dtype", "template", "grid", "threadgroup")
    max_rows = 16

    def settle(self, w: mx.array, scales: mx.array, biases: mx.array, dtype: mx.Dtype, k: int) -> None:
        self.w = w
        self.scales = scales if scales.dtype == dtype else scales.astype(dtype)
        self.biases = biases if biases.dtype == dtype else biases.astype(dtype)
        self.n, self.k, self.dtype = w.shape[0], k, dtype

    def kernel(self) -> Any:
        raise NotImplementedError

    def __call__(self, x: mx.array) -> mx.array:
        operands = [self.w, self.scales, self.biases]
        geometry = (self.template, self.grid, self.threadgroup)
        return launch_in_row_blocks(self.kernel(), x, self.n, operands, *geometry, self.max_rows)
