"""The row-invariant quantized matmul: its pure-MLX reference, and how exact mode chooses the kernel.

The CUDA kernel itself runs on the GPU (``pytest -m gpu`` through the device, and
``scripts/gpu/kernels.py``); here its reference arithmetic, the probe's verdict off CUDA, and the
calibration's choice, fallback and rejection of the kernel level are tested with stand-ins.
"""

from __future__ import annotations

import warnings

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import build_tiny, emulate_gpu

from specbench import kernels
from specbench.exact import calibrate, exact_mode
from specbench.exact import calibration as exact_calibration
from specbench.kernels import probe as kernel_probe
from specbench.kernels import qmv as qmv_module
from specbench.kernels import qmv_rows_reference
from specbench.kernels.jit import kernel_name


def _host(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)).astype(np.float64)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("bits,group_size", [(4, 32), (4, 64), (8, 64), (4, 128), (8, 128)])
@pytest.mark.parametrize("k", [576, 1024])  # 576: a residue pass after one full pass of 512 (4-bit)
def test_reference_rows_do_not_depend_on_other_rows_and_match_the_product(dtype, bits, group_size, k):
    if k % group_size:
        pytest.skip("K must be a multiple of the group size")
    mx.random.seed(1)
    n = 24
    weight = (mx.random.normal((n, k)) / k**0.5).astype(dtype)
    w, scales, biases = mx.quantize(weight, group_size=group_size, bits=bits)
    x = mx.random.normal((9, k)).astype(dtype)
    together = _host(qmv_rows_reference(x, w, scales, biases, group_size, bits))
    for i in range(9):  # each row alone, and inside other row counts, is the same row
        alone = _host(qmv_rows_reference(x[i : i + 1], w, scales, biases, group_size, bits))
        assert np.array_equal(together[i], alone[0])
    assert np.array_equal(together[:3], _host(qmv_rows_reference(x[:3], w, scales, biases, group_size, bits)))
    truth = _host(x) @ _host(mx.dequantize(w, scales, biases, group_size=group_size, bits=bits)).T
    scale = np.abs(truth).max()
    # Partial sums in the activation type over K / 512 passes, then a float reduction: a few of its ulps.
    ulp = 2**-7 if dtype == mx.bfloat16 else 2**-10
    assert np.abs(together - truth).max() <= 8 * ulp * scale
    mlx = _host(mx.quantized_matmul(x, w, scales, biases, True, group_size, bits))
    assert np.abs(together - mlx).max() <= 0.1 * scale  # MLX's CPU product rounds its own way


def test_the_kernel_refuses_what_it_does_not_compute():
    x = mx.zeros((2, 64), dtype=mx.bfloat16)
    assert kernels.supports(x, 4, 64) and not kernels.supports(x, 3, 64) and not kernels.supports(x, 4, 16)
    assert not kernels.supports(x.astype(mx.float32), 4, 64) and not kernels.supports(x, 4, 64, mode="mxfp4")
    with pytest.raises(ValueError, match="qmv_rows computes affine"):
        kernels.qmv_rows(x, mx.zeros((8, 8), dtype=mx.uint32), mx.zeros((8, 1)), mx.zeros((8, 1)), 64, 3)
    with pytest.raises(ValueError, match="unknown dequant variant"):
        kernels.qmv_rows(x, mx.zeros((8, 8), dtype=mx.uint32), mx.zeros((8, 1)), mx.zeros((8, 1)), 64, 4, "fast")
    with pytest.raises(ValueError, match="unknown schedule"):
        kernels.qmv_rows(
            x, mx.zeros((8, 8), dtype=mx.uint32), mx.zeros((8, 1)), mx.zeros((8, 1)), 64, 4, "fma", "tiled"
        )
    with pytest.raises(ValueError, match="features_per_block must be 1 to 32"):
        kernels.qmv_rows(
            x, mx.zeros((8, 8), dtype=mx.uint32), mx.zeros((8, 1)), mx.zeros((8, 1)), 64, 4, "fma", "loop", 0
        )


def test_off_cuda_the_probe_finds_no_kernel_and_calibration_does_not_try_it():
    assert not kernels.cuda_available()
    assert kernels.qmv_variant(mx.bfloat16, 4, 64) is None
    model = _quantized_tiny()
    assert not exact_calibration.uses_kernel(model)


def _quantized_tiny() -> nn.Module:
    model = build_tiny("qwen3")
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def _row_by_row(x, w, scales, biases, group_size, bits, dequant="mul-add"):
    """A stand-in kernel that is exact by construction: MLX's own product, one row per call."""
    flat = x.reshape(-1, x.shape[-1])
    rows = [mx.quantized_matmul(flat[i : i + 1], w, scales, biases, True, group_size, bits) for i in range(len(flat))]
    return mx.concatenate(rows).reshape(*x.shape[:-1], w.shape[0])


def _on_cuda(monkeypatch, kernel) -> None:
    """Pretend the kernel runs here: the probe proved variant "mul-add", and ``kernel`` (with ``qmv_rows``'s
    arguments) is the kernel that exact mode's per-layer launcher runs."""

    def launcher(w, scales, biases, group_size, bits, dtype, k, dequant):
        return lambda x: kernel(x, w, scales, biases, group_size, bits, dequant)

    monkeypatch.setattr(kernels, "cuda_available", lambda: True)
    monkeypatch.setattr(kernels, "qmv_variant", lambda dtype, bits, group_size: "mul-add")
    monkeypatch.setattr(kernels, "launcher", launcher)
    monkeypatch.setattr(kernel_probe, "_warned", set())
    exact_calibration._calibrations.clear()


def test_calibration_takes_the_kernel_level_where_it_is_exact(monkeypatch):
    emulate_gpu(monkeypatch, attention=True, linear_rows=1)  # batched products are not row-invariant
    _on_cuda(monkeypatch, _row_by_row)
    model = _quantized_tiny()
    calibration = calibrate(model, [4], measure=False, boundary=False, save=False)
    assert calibration.level_for(4) == "attention+linear/kernel"
    tokens = mx.array([[3, 5, 7, 11]])
    from mlx_lm.models.cache import make_prompt_cache

    serial_cache, verify_cache = make_prompt_cache(model), make_prompt_cache(model)
    serial = mx.concatenate([model(tokens[:, i : i + 1], cache=serial_cache) for i in range(4)], axis=1)
    with exact_mode(model, "attention+linear/kernel"):
        verified = model(tokens, cache=verify_cache)
    assert np.array_equal(_host(verified), _host(serial))


def test_a_kernel_that_fails_is_a_recorded_fallback_with_one_warning(monkeypatch):
    emulate_gpu(monkeypatch, attention=True, linear_rows=1)

    def broken(*args, **kwargs):
        raise RuntimeError("Failed to compile kernel: (emulated)")

    _on_cuda(monkeypatch, broken)
    model = _quantized_tiny()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calibration = calibrate(model, [3, 4], measure=False, boundary=False, save=False)
    assert all(calibration.level_for(w) != "attention+linear/kernel" for w in (3, 4))
    failed = [t for t in calibration.rows() if t["level"] == "attention+linear/kernel"]
    assert failed and all(not t["exact"] and "emulated" in t["error"] for t in failed)
    assert sum("linear/kernel is not used" in str(w.message) for w in caught) == 1


def test_a_kernel_that_is_not_bit_identical_is_rejected(monkeypatch):
    emulate_gpu(monkeypatch, attention=True, linear_rows=1)
    _on_cuda(monkeypatch, lambda x, w, s, b, g, bits, dequant="mul-add": qmv_rows_reference(x, w, s, b, g, bits))
    model = _quantized_tiny()
    calibration = calibrate(model, [4], measure=False, boundary=False, save=False)
    assert calibration.level_for(4) != "attention+linear/kernel"
    assert any(t["level"] == "attention+linear/kernel" and not t["exact"] for t in calibration.rows())


def test_a_kernel_is_named_by_its_source():
    """MLX caches a compiled kernel on disk by name: a changed source must not load the old machine code."""
    name = kernel_name("specbench_qmv_rows", qmv_module._HEADER, qmv_module._SOURCE)
    assert name.startswith("specbench_qmv_rows_")
    assert kernel_name("specbench_qmv_rows", qmv_module._HEADER, qmv_module._SOURCE + " ") != name


def test_a_layers_kernel_call_is_settled_once_and_again_when_its_weights_change(monkeypatch):
    """Exact mode settles a layer's kernel call on its first use (host time per call is part of the verify's
    cost) and settles it again when the layer's weights are replaced."""
    from specbench.exact.kernel_calls import kernel_product

    made = []

    def launcher(w, scales, biases, group_size, bits, dtype, k, dequant):
        made.append(w)
        return lambda x: _row_by_row(x, w, scales, biases, group_size, bits)

    monkeypatch.setattr(kernels, "cuda_available", lambda: True)
    monkeypatch.setattr(kernels, "qmv_variant", lambda dtype, bits, group_size: "mul-add")
    monkeypatch.setattr(kernels, "launcher", launcher)
    first, second = (nn.QuantizedLinear(64, 32, group_size=32, bits=4) for _ in range(2))
    for layer in (first, second):
        layer.set_dtype(mx.bfloat16)
    x = mx.random.normal((3, 64)).astype(mx.bfloat16)
    rows = [_host(kernel_product(first, x)) for _ in range(3)]
    assert len(made) == 1
    assert all(np.array_equal(r, _host(_row_by_row(x, first.weight, first.scales, first.biases, 32, 4))) for r in rows)
    first.update(second.parameters())
    replaced = _host(kernel_product(first, x))
    assert len(made) == 2
    assert np.array_equal(replaced, _host(_row_by_row(x, second.weight, second.scales, second.biases, 32, 4)))
    kernel_product(first, x.astype(mx.float16))  # another activation type: settled again
    assert len(made) == 3
