"""The Metal row-invariant quantized matmul: its pure-MLX reference, the shapes it takes, and how the probe and
exact mode choose it on a Metal device (pretended here: there is no Mac; the kernel itself is checked on a Mac by
the ``metal`` test below, which the probe also runs before any use)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from specbench import kernels
from specbench.exact import calibration as exact_calibration
from specbench.kernels import probe as kernel_probe
from specbench.kernels import qmv, qmv_metal, verdicts
from specbench.kernels.qmv_metal import qmv_rows_metal_reference


def _host(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)).astype(np.float64)


def _layer(n: int, k: int, bits: int, group_size: int, dtype: mx.Dtype, seed: int = 1):
    mx.random.seed(seed)
    weight = (mx.random.normal((n, k)) / k**0.5).astype(dtype)
    return mx.quantize(weight, group_size=group_size, bits=bits)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize(
    "bits,group_size,k", [(4, 32, 512), (4, 64, 1024), (4, 128, 1536), (8, 64, 256), (8, 128, 768)]
)
def test_reference_rows_do_not_depend_on_other_rows_and_match_the_product(dtype, bits, group_size, k):
    w, scales, biases = _layer(16, k, bits, group_size, dtype)
    x = mx.random.normal((9, k)).astype(dtype)
    together = _host(qmv_rows_metal_reference(x, w, scales, biases, group_size, bits))
    for i in range(9):
        alone = _host(qmv_rows_metal_reference(x[i : i + 1], w, scales, biases, group_size, bits))
        assert np.array_equal(together[i], alone[0])
    truth = _host(x) @ _host(mx.dequantize(w, scales, biases, group_size=group_size, bits=bits)).T
    scale = np.abs(truth).max()
    ulp = 2**-7 if dtype == mx.bfloat16 else 2**-10  # float sums, one rounding to the output type (and the sum's)
    assert np.abs(together - truth).max() <= 4 * ulp * scale
    mlx = _host(mx.quantized_matmul(x, w, scales, biases, True, group_size, bits))
    assert np.abs(together - mlx).max() <= 0.1 * scale  # MLX's CPU product rounds its own way


def test_the_shapes_it_takes_are_those_of_mlx_one_row_qmv_fast():
    x = mx.zeros((2, 1024), dtype=mx.bfloat16)
    assert qmv_metal.supports(x, 24, 4, 64) and qmv_metal.supports(x, 24, 8, 128)
    assert not qmv_metal.supports(x, 20, 4, 64)  # N not a multiple of 8: MLX runs qmv, not qmv_fast
    assert not qmv_metal.supports(mx.zeros((2, 576), dtype=mx.bfloat16), 24, 4, 64)  # K not a multiple of 512
    assert qmv_metal.supports(mx.zeros((2, 768), dtype=mx.bfloat16), 24, 8, 64)  # 8 bits: passes of 256
    assert not qmv_metal.supports(mx.zeros((2, 128), dtype=mx.bfloat16), 24, 8, 64)  # K 128: MLX's qmv_quad
    assert not qmv_metal.supports(x.astype(mx.float32), 24, 4, 64) and not qmv_metal.supports(x, 24, 3, 64)
    assert not qmv_metal.supports(x, 24, 4, 64, biases=None) and not qmv_metal.supports(x, 24, 4, 64, "mxfp4")
    float32_biases = mx.zeros((24, 16), dtype=mx.float32)  # MLX would compute in float32: not qmv_fast's T
    assert not qmv_metal.supports(x, 24, 4, 64, biases=float32_biases)
    assert qmv_metal.supports(x, 24, 4, 64, biases=float32_biases.astype(mx.bfloat16))


@pytest.fixture
def on_metal(tmp_path, monkeypatch):
    """Metal pretended (not CUDA), an empty verdict store in a temporary home."""
    monkeypatch.setenv("SPECBENCH_HOME", str(tmp_path))
    monkeypatch.setattr(qmv_metal, "metal_available", lambda: True)
    monkeypatch.setattr(kernels, "metal_available", lambda: True)
    monkeypatch.setattr(kernel_probe, "cuda_available", lambda: False)
    monkeypatch.setattr(kernels, "cuda_available", lambda: False)
    monkeypatch.setattr(kernel_probe, "_warned", set())
    verdicts.forget()
    yield
    verdicts.forget()


def test_on_metal_the_probe_runs_the_metal_kernel_on_its_shapes_and_proves_it(on_metal, monkeypatch):
    ran = []

    def launcher_call(self, x):  # the kernel as it should be: MLX's one-row products, each row alone
        ran.append((x.shape[0], self.n, self.k))
        rows = [mx.quantized_matmul(x[i : i + 1], self.w, self.scales, self.biases, True, 64, 4) for i in range(len(x))]
        return mx.concatenate(rows)

    monkeypatch.setattr(qmv_metal.MetalQmvLauncher, "__call__", launcher_call)
    assert kernels.qmv_variant(mx.bfloat16, 4, 64) == qmv_metal.VARIANT
    assert {(n, k) for _, n, k in ran} == {(40, 1024), (24, 2048)}  # (72, 576) has no qmv_fast on Metal
    assert {m for m, _, _ in ran} == set(kernel_probe.PROBE_ROWS)
    assert verdicts.load("qmv_rows_metal", _probe_args()) == verdicts.Verdict(qmv_metal.VARIANT)


def test_on_metal_a_kernel_whose_rows_differ_is_not_used(on_metal, monkeypatch):
    def reference_call(self, x):  # close to MLX's product, not bit-identical to it
        return qmv_rows_metal_reference(x, self.w, self.scales, self.biases, 64, 4)

    monkeypatch.setattr(qmv_metal.MetalQmvLauncher, "__call__", reference_call)
    with pytest.warns(UserWarning, match="qmv_rows_metal is not used"):
        assert kernels.qmv_variant(mx.bfloat16, 4, 64) is None


def test_on_metal_exact_mode_settles_the_metal_launcher_for_quantized_layers_only(on_metal):
    w, scales, biases = _layer(24, 1024, 4, 64, mx.bfloat16)
    made = kernels.launcher(w, scales, biases, 64, 4, mx.bfloat16, 1024, qmv_metal.VARIANT)
    assert isinstance(made, qmv_metal.MetalQmvLauncher)
    assert made.grid == (32, 2 * 3, 1) and made.threadgroup == (32, 2, 1)  # one threadgroup per 8 features
    assert dict(made.template) == {"T": mx.bfloat16, "BITS": 4, "GROUP": 64, "K": 1024, "N": 24}
    assert isinstance(kernels.launcher(w, scales, biases, 64, 4, mx.bfloat16, 1024, "fma"), qmv.QmvLauncher)
    x = mx.zeros((1, 1024), dtype=mx.bfloat16)
    assert kernels.supports(x, 4, 64, n=24) and not kernels.supports(x, 4, 64, n=20) and not kernels.supports(x, 4, 64)
    import mlx.nn as nn
    from conftest import build_tiny

    model = build_tiny("qwen3")
    assert not exact_calibration.uses_kernel(model)  # no unquantized kernel on Metal
    nn.quantize(model, group_size=32, bits=4)
    assert exact_calibration.uses_kernel(model)


def _probe_args() -> dict:
    args = {"dtype": "bfloat16", "bits": 4, "group_size": 64, "variants": (qmv_metal.VARIANT,)}
    return args | {
        "schedule": qmv.DEFAULT_SCHEDULE,
        "rows": kernel_probe.PROBE_ROWS,
        "shapes": kernel_probe.PROBE_SHAPES,
    }


@pytest.mark.metal
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("bits,group_size", [(4, 64), (4, 32), (8, 64)])
def test_on_a_mac_every_row_is_mlx_one_row_product(dtype, bits, group_size):
    if not qmv_metal.metal_available():
        pytest.skip("needs MLX on Metal (a Mac)")
    w, scales, biases = _layer(40, 2048, bits, group_size, dtype)
    x = mx.random.normal((16, 2048)).astype(dtype)
    alone = _host(
        mx.concatenate(
            [mx.quantized_matmul(x[i : i + 1], w, scales, biases, True, group_size, bits) for i in range(16)]
        )
    )
    for m in (1, 2, 9, 16):
        got = _host(kernels.qmv_rows(x[:m], w, scales, biases, group_size, bits, qmv_metal.VARIANT))
        assert np.array_equal(got, alone[:m])
