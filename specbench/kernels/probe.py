"""The kernels' probe: on this device, which variant of a kernel reproduces MLX's one-row result.

(For ``attention_rows``: MLX's one-query attention of each row, ``attention_variant``.)

A kernel is used only where this probe proves it: random inputs of a few shapes and the row counts
of ``PROBE_ROWS`` (1 to ``MAX_ROWS``), each row of the kernel's result compared bit for bit with MLX's own
product of that row alone. Verdicts are kept per process and stored per device, MLX version and kernel
source (``specbench.kernels.verdicts``), so later processes do not probe again. A kernel that fails to
compile or run is a recorded fallback with one warning (never an error for the user).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from specbench.kernels import attention, gemv, qmv, qmv_metal, verdicts

#: Row counts a variant is proved on before use (each is a kernel compile). A kernel's rows run the same
#: arithmetic whatever their count (it only bounds a loop), and calibration checks every width it uses
#: bit for bit at the model level, so these cover one, few, MLX's switch at 8 and the most.
PROBE_ROWS = (1, 2, 3, 4, 7, 8, 9, 16)
#: (N, K) shapes the probe runs: a K with a residue pass, a K of exact passes, a wide K.
PROBE_SHAPES = ((72, 576), (40, 1024), (24, 2048))


def cuda_available() -> bool:
    """Whether MLX runs on CUDA here (the kernels are CUDA sources)."""
    cuda = getattr(mx, "cuda", None)
    return bool(cuda is not None and cuda.is_available() and mx.default_device().type == mx.DeviceType.gpu)


def _host(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32))


def qmv_matches(
    dtype: mx.Dtype,
    bits: int,
    group_size: int,
    dequant: str,
    rows: Sequence[int] = PROBE_ROWS,
    seed: int = 0,
    schedule: str = qmv.DEFAULT_SCHEDULE,
) -> dict[str, Any]:
    """Whether ``qmv_rows`` with ``dequant`` (and ``schedule``) equals MLX's one-row quantized matmul on every
    row, for every shape of ``PROBE_SHAPES`` and every row count in ``rows``; with the rows that differed."""
    mx.random.seed(seed)
    mismatches = []
    for n, k in PROBE_SHAPES:
        x = mx.random.normal((max(rows), k)).astype(dtype)
        if k % group_size or not qmv.supports(x, bits, group_size, n=n):
            continue
        weight = (mx.random.normal((n, k)) / k**0.5).astype(dtype)
        w, scales, biases = mx.quantize(weight, group_size=group_size, bits=bits)
        alone = mx.concatenate(
            [mx.quantized_matmul(x[i : i + 1], w, scales, biases, True, group_size, bits) for i in range(max(rows))]
        )
        expected = _host(alone)
        for m in rows:
            got = _host(qmv.qmv_rows(x[:m], w, scales, biases, group_size, bits, dequant, schedule))
            bad = [i for i in range(m) if not np.array_equal(got[i], expected[i])]
            if bad:
                mismatches.append({"shape": (n, k), "rows": m, "rows_differing": bad})
    return {"exact": not mismatches, "mismatches": mismatches[:4]}


def qmv_variant(dtype: mx.Dtype, bits: int, group_size: int) -> str | None:
    """The dequant variant of ``qmv_rows`` that reproduces MLX's one-row product on this device
    (None: none does, or the kernel cannot run here; the reason is warned once)."""
    key = ("qmv_rows", dtype, bits, group_size, qmv.DEFAULT_SCHEDULE)
    return _remembered(key, lambda: _qmv_variant(dtype, bits, group_size))


def _qmv_variant(dtype: mx.Dtype, bits: int, group_size: int) -> str | None:
    metal = qmv_metal.metal_available()
    if not (cuda_available() or metal):
        return None
    variants = (qmv_metal.VARIANT,) if metal else qmv.DEQUANT
    args = {"dtype": _name(dtype), "bits": bits, "group_size": group_size, "variants": variants}
    args |= {"schedule": qmv.DEFAULT_SCHEDULE, "rows": PROBE_ROWS, "shapes": PROBE_SHAPES}
    return _proved(
        "qmv_rows_metal" if metal else "qmv_rows",
        args,
        variants,
        lambda dequant: qmv_matches(dtype, bits, group_size, dequant),
        f"no variant reproduces MLX's one-row product for {dtype}, {bits} bits, group {group_size}",
    )


def _remembered(key: tuple[Any, ...], look_up: Callable[[], str | None]) -> str | None:
    """The variant looked up under ``key`` in this process (``verdicts.variants_seen``), else ``look_up()``'s."""
    if key not in verdicts.variants_seen:
        verdicts.variants_seen[key] = look_up()
    return verdicts.variants_seen[key]


def _name(dtype: mx.Dtype) -> str:
    return str(dtype).split(".")[-1]


def _proved(
    kernel: str,
    args: dict[str, Any],
    variants: Sequence[str],
    matches: Callable[[str], dict[str, Any]],
    none: str,
) -> str | None:
    """The variant of ``kernel`` that its probe with ``args`` proved exact here: the stored verdict where there
    is one (``specbench.kernels.verdicts``), else the first of ``variants`` whose ``matches(variant)`` is exact,
    then stored; None with one warning naming ``kernel`` when none is (``none`` says what was looked for) or
    when a variant fails to compile or run (a verdict kept for this process only)."""
    verdict = verdicts.load(kernel, args, variants)
    probed = verdict is None
    if verdict is None:
        verdict, conclusive = _first_exact(variants, matches, none)
        verdicts.keep(kernel, args, verdict, store=conclusive)
    if verdict.variant is None:
        stored = "" if probed else f"; the verdict stored in {verdicts.store_path()}"
        warn_fallback(kernel, (verdict.reason or none) + stored)
    return verdict.variant


def _first_exact(
    variants: Sequence[str], matches: Callable[[str], dict[str, Any]], none: str
) -> tuple[verdicts.Verdict, bool]:
    """The first of ``variants`` whose ``matches(variant)`` is exact (a verdict of None, with ``none`` as its
    reason, when none is); and whether the verdict is conclusive: not when a variant failed to compile or run."""
    for variant in variants:
        try:
            if matches(variant)["exact"]:
                return verdicts.Verdict(variant), True
        except Exception as err:  # a kernel that does not compile or run is a fallback, not an error
            return verdicts.Verdict(None, f"{type(err).__name__}: {err}"), False
    return verdicts.Verdict(None, none), True


_warned: set[str] = set()


def warn_fallback(kernel: str, reason: str) -> None:
    """Warn once per kernel and process that ``kernel`` is not used, and why."""
    if kernel in _warned:
        return
    _warned.add(kernel)
    warnings.warn(
        f"specbench kernel {kernel} is not used on this device ({reason}); exact verification keeps MLX's "
        "kernels split row by row (slower, still exact)",
        stacklevel=3,
    )


def gemv_matches(dtype: mx.Dtype, accumulate: str, rows: Sequence[int] = PROBE_ROWS, seed: int = 0) -> dict[str, Any]:
    """Whether ``gemv_rows`` with ``accumulate`` equals MLX's one-row product ``x @ w.T`` on every row,
    for every shape of ``PROBE_SHAPES`` (and a K of 64 and of 32 times an odd number, MLX's other lane
    widths) and every row count in ``rows``; with the rows that differed."""
    mx.random.seed(seed)
    mismatches = []
    for n, k in (*PROBE_SHAPES, (24, 1088), (16, 1056)):
        weight = (mx.random.normal((n, k)) / k**0.5).astype(dtype)
        x = mx.random.normal((max(rows), k)).astype(dtype)
        expected = _host(mx.concatenate([x[i : i + 1] @ weight.T for i in range(max(rows))]))
        for m in rows:
            got = _host(gemv.gemv_rows(x[:m], weight, accumulate))
            bad = [i for i in range(m) if not np.array_equal(got[i], expected[i])]
            if bad:
                mismatches.append({"shape": (n, k), "rows": m, "rows_differing": bad})
    return {"exact": not mismatches, "mismatches": mismatches[:4]}


def gemv_variant(dtype: mx.Dtype) -> str | None:
    """The accumulation of ``gemv_rows`` that reproduces MLX's one-row product on this device (None: none
    does, or the kernel cannot run here; the reason is warned once)."""
    return _remembered(("gemv_rows", dtype), lambda: _gemv_variant(dtype))


def _gemv_variant(dtype: mx.Dtype) -> str | None:
    if not cuda_available():
        return None
    args = {"dtype": _name(dtype), "variants": gemv.ACCUMULATE, "rows": PROBE_ROWS, "shapes": PROBE_SHAPES}
    return _proved(
        "gemv_rows",
        args,
        gemv.ACCUMULATE,
        lambda accumulate: gemv_matches(dtype, accumulate),
        f"no accumulation reproduces MLX's one-row product for {dtype}",
    )


#: Cache prefixes the attention probe runs; row i of a w-row causal block attends ``prefix + i + 1`` keys:
#: fewer keys than warps, one pass, a block crossing the two-pass threshold (1024 keys), two passes.
ATTENTION_PREFIXES = (20, 300, 1016, 2500)


def attention_matches(
    dtype: mx.Dtype,
    head_dim: int,
    variant: str,
    rows: Sequence[int] = PROBE_ROWS,
    prefixes: Sequence[int] = ATTENTION_PREFIXES,
    heads: int = 8,
    kv_heads: int = 2,
    seed: int = 0,
) -> dict[str, Any]:
    """Whether every row of ``attention_rows`` (a causal block of m rows, m in ``rows``, after each cache
    prefix of ``prefixes``) equals MLX's one-query ``scaled_dot_product_attention`` over the keys that row
    attends (no mask, as a decode step calls it); with the rows that differed."""
    mx.random.seed(seed)
    widest = max(rows)
    scale = head_dim**-0.5
    mismatches = []
    for prefix in prefixes:
        n = prefix + widest
        q = mx.random.normal((1, heads, widest, head_dim)).astype(dtype)
        k = mx.random.normal((1, kv_heads, n, head_dim)).astype(dtype)
        v = mx.random.normal((1, kv_heads, n, head_dim)).astype(dtype)
        alone = [
            mx.fast.scaled_dot_product_attention(
                q[:, :, i : i + 1], k[:, :, : prefix + i + 1], v[:, :, : prefix + i + 1], scale=scale
            )
            for i in range(widest)
        ]
        expected = _host(mx.concatenate(alone, axis=2))
        for m in rows:
            mask = "causal" if m > 1 else None
            got = _host(
                attention.attention_rows(
                    q[:, :, :m], k[:, :, : prefix + m], v[:, :, : prefix + m], scale, mask, variant
                )
            )
            bad = [i for i in range(m) if not np.array_equal(got[:, :, i], expected[:, :, i])]
            if bad:
                mismatches.append({"prefix": prefix, "rows": m, "rows_differing": bad})
    return {"exact": not mismatches, "mismatches": mismatches[:4]}


def attention_variant(dtype: mx.Dtype, head_dim: int) -> str | None:
    """The variant of ``attention_rows`` that reproduces MLX's one-query attention on this device
    (None: none does, the shape is not computed, or the kernel cannot run here; the reason is warned once)."""
    return _remembered(("attention_rows", dtype, head_dim), lambda: _attention_variant(dtype, head_dim))


def _attention_variant(dtype: mx.Dtype, head_dim: int) -> str | None:
    if not cuda_available() or head_dim not in attention.HEAD_DIMS or dtype not in attention.DTYPES:
        return None
    args = {"dtype": _name(dtype), "head_dim": head_dim, "variants": attention.VARIANTS, "rows": PROBE_ROWS}
    args["prefixes"] = ATTENTION_PREFIXES
    return _proved(
        "attention_rows",
        args,
        attention.VARIANTS,
        lambda variant: attention_matches(dtype, head_dim, variant),
        f"no variant reproduces MLX's one-query attention for {dtype}, head dimension {head_dim}",
    )
