"""The row-invariant unquantized matmul: its pure-MLX reference, and exact mode's use of it.

The CUDA kernel runs on the GPU (``pytest -m gpu``); here its reference arithmetic, the probe off CUDA,
and the calibration's choice of the kernel level for an unquantized model are tested with a stand-in.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import build_tiny, emulate_gpu
from mlx_lm.models.cache import make_prompt_cache

from specbench import kernels
from specbench.exact import calibrate, exact_mode
from specbench.exact import calibration as exact_calibration
from specbench.kernels import gemv_rows_reference
from specbench.kernels import probe as kernel_probe
from specbench.kernels.gemv import elements_per_lane


def _host(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)).astype(np.float64)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
@pytest.mark.parametrize("k", [1024, 576, 1056, 100])  # 4, 2, 1, 1 inputs per lane; 100: lanes past K
def test_reference_rows_do_not_depend_on_other_rows_and_match_the_product(dtype, k):
    mx.random.seed(k)
    weight = (mx.random.normal((48, k)) / k**0.5).astype(dtype)
    x = mx.random.normal((9, k)).astype(dtype)
    together = _host(gemv_rows_reference(x, weight))
    for i in range(9):
        assert np.array_equal(together[i], _host(gemv_rows_reference(x[i : i + 1], weight))[0])
    exact = _host(x) @ _host(weight).T
    tolerance = {mx.bfloat16: 2e-2, mx.float16: 2e-3, mx.float32: 1e-5}[dtype]
    np.testing.assert_allclose(together, exact, rtol=tolerance, atol=tolerance)


def test_lane_widths_follow_mlx():
    assert [elements_per_lane(k) for k in (4096, 576, 1056, 100)] == [4, 2, 1, 1]


def test_the_kernel_refuses_what_it_does_not_compute():
    x = mx.zeros((2, 64), dtype=mx.bfloat16)
    with pytest.raises(ValueError, match="gemv_rows computes x @ weight.T"):
        kernels.gemv_rows(x, mx.zeros((8, 64), dtype=mx.float16))
    with pytest.raises(ValueError, match="gemv_rows computes x @ weight.T"):
        kernels.gemv_rows(x, mx.zeros((8, 32), dtype=mx.bfloat16))
    with pytest.raises(ValueError, match="unknown accumulation"):
        kernels.gemv_rows(x, mx.zeros((8, 64), dtype=mx.bfloat16), "fast")


def test_off_cuda_the_probe_finds_no_kernel():
    assert kernels.gemv_variant(mx.bfloat16) is None


def test_calibration_takes_the_kernel_level_for_an_unquantized_model(monkeypatch):
    emulate_gpu(monkeypatch, attention=True, linear_rows=1)  # batched products are not row-invariant

    def row_by_row(x, weight, accumulate="fma"):  # a stand-in exact by construction: MLX's one-row products
        flat = x.reshape(-1, x.shape[-1])
        rows = [flat[i : i + 1] @ weight.T for i in range(flat.shape[0])]
        return mx.concatenate(rows).reshape(*x.shape[:-1], weight.shape[0])

    monkeypatch.setattr(kernels, "cuda_available", lambda: True)
    monkeypatch.setattr(kernels, "gemv_variant", lambda dtype: "fma")
    monkeypatch.setattr(kernels, "gemv_rows", row_by_row)
    monkeypatch.setattr(kernel_probe, "_warned", set())
    exact_calibration._calibrations.clear()
    model = build_tiny("qwen3")
    model.set_dtype(mx.bfloat16)
    assert exact_calibration.uses_kernel(model)
    calibration = calibrate(model, [4], measure=False, boundary=False, save=False)
    assert calibration.level_for(4) == "attention+linear/kernel"
    tokens = mx.array([[3, 5, 7, 11]])
    serial_cache, verify_cache = make_prompt_cache(model), make_prompt_cache(model)
    serial = mx.concatenate([model(tokens[:, i : i + 1], cache=serial_cache) for i in range(4)], axis=1)
    with exact_mode(model, "attention+linear/kernel"):
        verified = model(tokens, cache=verify_cache)
    assert np.array_equal(_host(verified), _host(serial))
