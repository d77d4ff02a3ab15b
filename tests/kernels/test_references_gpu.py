"""On a CUDA device: each CUDA kernel against the pure-MLX reference the CPU suite tests in its place (``pytest -m
gpu``; skipped elsewhere). Where the reference does the kernel's arithmetic (``gemv_rows``'s "mul-add" accumulation:
products and sums rounded separately, in the kernel's order) they must agree bit for bit; where the kernel fuses a
multiply-add the reference rounds twice (``qmv_rows``, ``attention_rows``), so they must agree to a few roundings of
the output's type, and a kernel that computed something else would miss by far more."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from specbench.kernels import (
    attention_rows,
    attention_rows_reference,
    attention_variant,
    gemv_rows,
    gemv_rows_reference,
    qmv_rows,
    qmv_rows_reference,
    qmv_variant,
)
from specbench.kernels.probe import cuda_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="the kernels are CUDA sources: run on a CUDA device"),
]


def _host(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32))


def _within_roundings(got: np.ndarray, expected: np.ndarray, dtype: mx.Dtype, roundings: int = 4) -> float:
    """The largest difference in units of the output type's rounding at the output's scale (asserted <= roundings)."""
    eps = {mx.bfloat16: 2.0**-8, mx.float16: 2.0**-11, mx.float32: 2.0**-24}[dtype]
    scale = max(float(np.abs(expected).max()), 1e-30)
    worst = float(np.abs(got - expected).max()) / (eps * scale)
    assert worst <= roundings, f"kernel and reference differ by {worst:.1f} roundings at the output's scale"
    return worst


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("k", [4096, 4096 + 96])  # the second ends in a partial pass
def test_gemv_mul_add_equals_its_reference_bit_for_bit(dtype, k):
    mx.random.seed(11)
    weight = (mx.random.normal((512, k)) / k**0.5).astype(dtype)
    x = mx.random.normal((16, k)).astype(dtype)
    expected = _host(gemv_rows_reference(x, weight).astype(dtype))
    for rows in (1, 9, 16):
        got = _host(gemv_rows(x[:rows], weight, "mul-add"))
        assert np.array_equal(got, expected[:rows]), f"{rows} rows: gemv_rows (mul-add) is not its reference"


@pytest.mark.parametrize("dtype,bits,group_size", [(mx.bfloat16, 4, 64), (mx.bfloat16, 8, 64), (mx.float16, 4, 32)])
def test_qmv_rows_agree_with_their_reference(dtype, bits, group_size):
    variant = qmv_variant(dtype, bits, group_size)
    assert variant is not None, "the probe found no variant of qmv_rows equal to MLX's one-row product"
    mx.random.seed(bits + group_size)
    w, scales, biases = mx.quantize(
        (mx.random.normal((512, 4096)) / 64).astype(dtype), group_size=group_size, bits=bits
    )
    x = mx.random.normal((9, 4096)).astype(dtype)
    got = _host(qmv_rows(x, w, scales, biases, group_size, bits, variant))
    expected = _host(qmv_rows_reference(x, w, scales, biases, group_size, bits).astype(dtype))
    print(f"qmv_rows {dtype} {bits}-bit g{group_size}: {_within_roundings(got, expected, dtype):.2f} roundings")


@pytest.mark.parametrize("dtype,head_dim", [(mx.bfloat16, 128), (mx.float16, 64)])
@pytest.mark.parametrize("n_keys", [40, 700])  # one pass, and the two-pass plan of long caches
def test_attention_rows_agree_with_their_reference(dtype, head_dim, n_keys):
    variant = attention_variant(dtype, head_dim)
    assert variant is not None, "the probe found no attention_rows variant equal to MLX's one-query attention"
    mx.random.seed(n_keys)
    q = mx.random.normal((1, 8, 5, head_dim)).astype(dtype)
    k = mx.random.normal((1, 2, n_keys, head_dim)).astype(dtype)
    v = mx.random.normal((1, 2, n_keys, head_dim)).astype(dtype)
    scale = head_dim**-0.5
    got = _host(attention_rows(q, k, v, scale, "causal", variant=variant))
    expected = _host(attention_rows_reference(q, k, v, scale, "causal").astype(dtype))
    print(f"attention_rows {dtype} d={head_dim} {n_keys} keys: {_within_roundings(got, expected, dtype):.2f} roundings")
