"""The row-invariant attention: its pure-MLX reference, its checks, and how exact mode chooses the kernel.

The CUDA kernel runs on the GPU (the ``gpu`` tests below, and ``python3 -m scripts.gpu.attention_kernel``);
here its reference arithmetic, the probe's verdict off CUDA, and the calibration's choice, rejection and
fallback of the ``attention/kernel`` level are tested with stand-ins.
"""

from __future__ import annotations

import warnings

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import build_tiny, emulate_gpu
from mlx_lm.models.cache import make_prompt_cache

from specbench import kernels
from specbench.exact import calibrate, exact_mode
from specbench.exact import calibration as exact_calibration
from specbench.kernels import attention as kernel_attention
from specbench.kernels import attention_rows_reference
from specbench.kernels import probe as kernel_probe


def _host(a: mx.array) -> np.ndarray:
    return np.array(a.astype(mx.float32)).astype(np.float64)


def _block(dtype, head_dim: int, prefix: int, rows: int, heads: int = 4, kv_heads: int = 2, seed: int = 1):
    mx.random.seed(seed)
    q = mx.random.normal((1, heads, rows, head_dim)).astype(dtype)
    k = mx.random.normal((1, kv_heads, prefix + rows, head_dim)).astype(dtype)
    v = mx.random.normal((1, kv_heads, prefix + rows, head_dim)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize(
    "dtype,head_dim,prefix",
    [
        (mx.bfloat16, 128, 20),  # fewer keys than the single pass's 32 warps
        (mx.float16, 64, 300),  # one pass
        (mx.bfloat16, 64, 1018),  # the block crosses the two-pass threshold (1024 keys)
        (mx.float16, 128, 1300),  # two passes
    ],
)
def test_reference_rows_do_not_depend_on_other_rows_and_match_attention(dtype, head_dim, prefix):
    rows = 9
    q, k, v = _block(dtype, head_dim, prefix, rows)
    scale = head_dim**-0.5
    together = _host(attention_rows_reference(q, k, v, scale, "causal"))
    for i in range(rows):  # each row alone over the keys it attends is the same row
        n = prefix + i + 1
        alone = _host(attention_rows_reference(q[:, :, i : i + 1], k[:, :, :n], v[:, :, :n], scale))
        assert np.array_equal(together[:, :, i], alone[:, :, 0])
    mlx = _host(mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal"))
    # float accumulation, then one rounding to the output type: within a couple of its ulps of the largest output
    ulp = 2**-7 if dtype == mx.bfloat16 else 2**-10
    assert np.abs(together - mlx).max() <= 2 * ulp * np.abs(mlx).max()


def _batch_block(dtype, head_dim: int, starts: list[int], prefix: int, rows: int, seed: int = 2):
    """A batched causal block as mlx-lm's BatchKVCache holds it: batch row b's keys start at ``starts[b]``
    (left padding of random garbage, which no row may see)."""
    mx.random.seed(seed)
    n = prefix + rows
    q = mx.random.normal((len(starts), 4, rows, head_dim)).astype(dtype)
    k = mx.random.normal((len(starts), 2, n, head_dim)).astype(dtype)
    v = mx.random.normal((len(starts), 2, n, head_dim)).astype(dtype)
    return q, k, v


def test_reference_with_starts_computes_each_batch_row_over_its_own_keys():
    starts, prefix, rows = [0, 5, 17], 40, 3
    q, k, v = _batch_block(mx.bfloat16, 64, starts, prefix, rows)
    scale = 64**-0.5
    together = _host(attention_rows_reference(q, k, v, scale, "causal", starts=starts))
    for b, s in enumerate(starts):
        alone = _host(attention_rows_reference(q[b : b + 1], k[b : b + 1, :, s:], v[b : b + 1, :, s:], scale, "causal"))
        assert np.array_equal(together[b : b + 1], alone)
        mlx = _host(
            mx.fast.scaled_dot_product_attention(
                q[b : b + 1], k[b : b + 1, :, s:], v[b : b + 1, :, s:], scale=scale, mask="causal"
            )
        )
        assert np.abs(alone - mlx).max() <= 2 * 2**-7 * np.abs(mlx).max()
    # the padding changes nothing: garbage in it leaves every row as it was
    padding = mx.arange(k.shape[2])[None, None, :, None] < mx.array(starts)[:, None, None, None]
    garbage = mx.where(padding, k * 7, k)
    again = _host(attention_rows_reference(q, garbage, mx.where(padding, -v, v), scale, "causal", starts=starts))
    assert np.array_equal(again, together)
    for bad, message in (([0, 5], "each of the 3 batch rows"), ([0, 0, prefix + 1], "each of the 3 batch rows")):
        assert not kernel_attention.supports(q, k, v, "causal", bad)
        with pytest.raises(ValueError, match=message):
            attention_rows_reference(q, k, v, scale, "causal", starts=bad)
    q2, k2, v2 = _batch_block(mx.bfloat16, 64, [0, 10], 1020, 1)  # 1021 keys (one pass) and 1011
    assert kernel_attention.supports(q2, k2, v2, None, [0, 10])
    q3, k3, v3 = _batch_block(mx.bfloat16, 64, [0, 10], 1030, 1)  # 1031 keys (two passes) and 1021 (one)
    assert "two-pass threshold" in kernel_attention.check_inputs(q3, k3, v3, None, [0, 10])


def test_the_scale_is_rounded_as_each_pass_rounds_it():
    for head_dim in (64, 128):
        s = np.float32(head_dim**-0.5)
        assert kernel_attention.scale_log2(float(s), False) == np.float32(np.float64(s) * np.log2(np.e))
        assert kernel_attention.scale_log2(float(s), True) == s * np.float32(1.44269504089)
    assert kernel_attention.row_keys(3, 10, causal=True) == [8, 9, 10]
    assert kernel_attention._passes(4, 1026, causal=True) == [(0, 2, False), (2, 4, True)]


def test_the_kernel_refuses_what_it_does_not_compute():
    q, k, v = _block(mx.bfloat16, 64, 8, 2)
    assert kernel_attention.supports(q, k, v, "causal") and kernel_attention.supports(q[:, :, :1], k, v)
    cases = {
        "head dimension 96": (mx.zeros((1, 4, 2, 96), dtype=mx.bfloat16), mx.zeros((1, 2, 8, 96), dtype=mx.bfloat16)),
        "dtypes must be one of": (q.astype(mx.float32), k.astype(mx.float32)),
        "not a multiple of 3 KV heads": (q, mx.zeros((1, 3, 8, 64), dtype=mx.bfloat16)),
        "1 to 16 are computed": (mx.zeros((1, 4, 17, 64), dtype=mx.bfloat16), mx.zeros((1, 2, 20, 64), mx.bfloat16)),
        "at least as many keys": (mx.zeros((1, 4, 5, 64), dtype=mx.bfloat16), mx.zeros((1, 2, 4, 64), mx.bfloat16)),
    }
    for message, (queries, keys) in cases.items():
        assert not kernel_attention.supports(queries, keys, keys, "causal")
        with pytest.raises(ValueError, match=message):
            kernels.attention_rows(queries, keys, keys, 0.125, "causal")
    with pytest.raises(ValueError, match="mask must be None or 'causal'"):
        kernels.attention_rows(q, k, v, 0.125, mx.zeros((2, 10)))
    with pytest.raises(ValueError, match="unknown attention_rows variant"):
        kernels.attention_rows(q, k, v, 0.125, "causal", "fast")


def test_off_cuda_the_probe_finds_no_kernel_and_calibration_does_not_try_it():
    assert not kernels.cuda_available()
    assert kernels.attention_variant(mx.bfloat16, 128) is None
    model = _tiny()
    assert not exact_calibration.uses_attention_kernel(model)
    levels = [level for group in exact_calibration._candidates(4, moe=False) for level in group]
    assert not any("attention/kernel" in level for level in levels)


def _tiny() -> nn.Module:
    model = build_tiny("qwen3")
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    return model


def _one_query_rows(queries, keys, values, scale, mask=None, variant="source", vectors_per_warp=None, starts=None):
    """A stand-in kernel exact by construction: MLX's one-query attention per row, over the keys it attends."""
    rows, n = queries.shape[2], keys.shape[2]
    outs = [
        mx.fast.scaled_dot_product_attention(
            queries[:, :, i : i + 1], keys[:, :, : n - rows + i + 1], values[:, :, : n - rows + i + 1], scale=scale
        )
        for i in range(rows)
    ]
    return mx.concatenate(outs, axis=2)


def _on_cuda(monkeypatch, kernel) -> None:
    """Pretend the attention kernel runs here for any shape: the probe proved variant "source", and ``kernel``
    is the kernel (the tiny model's head dimension, 16, is not one the real kernel computes)."""
    monkeypatch.setattr(kernels, "cuda_available", lambda: True)
    monkeypatch.setattr(kernels, "attention_variant", lambda dtype, head_dim: "source")
    monkeypatch.setattr(kernels, "attention_rows", kernel)
    monkeypatch.setattr(kernel_attention, "supports", lambda queries, keys, values, mask=None, starts=None: True)
    monkeypatch.setattr(kernel_probe, "_warned", set())
    exact_calibration._calibrations.clear()


def test_calibration_takes_the_attention_kernel_where_it_is_exact(monkeypatch):
    emulate_gpu(monkeypatch, attention=True, linear_rows=None)  # multi-query attention is not row-invariant
    _on_cuda(monkeypatch, _one_query_rows)
    model = _tiny()
    assert exact_calibration.uses_attention_kernel(model)
    calibration = calibrate(model, [4], measure=False, boundary=False, save=False)
    assert calibration.level_for(4) == "attention/kernel"
    tokens = mx.array([[3, 5, 7, 11]])
    serial_cache, verify_cache = make_prompt_cache(model), make_prompt_cache(model)
    serial = mx.concatenate([model(tokens[:, i : i + 1], cache=serial_cache) for i in range(4)], axis=1)
    with exact_mode(model, "attention/kernel"):
        verified = model(tokens, cache=verify_cache)
    assert np.array_equal(_host(verified), _host(serial))


def test_an_attention_kernel_that_is_not_bit_identical_is_rejected(monkeypatch):
    emulate_gpu(monkeypatch, attention=True, linear_rows=None)
    sdpa = mx.fast.scaled_dot_product_attention  # the emulated one: its multi-query rows are off

    def multi_query(queries, keys, values, scale, mask=None, variant="source", vectors_per_warp=None, starts=None):
        return sdpa(queries, keys, values, scale=scale, mask=mask)

    _on_cuda(monkeypatch, multi_query)
    calibration = calibrate(_tiny(), [4], measure=False, boundary=False, save=False)
    assert calibration.level_for(4) == "attention"
    assert any(t["level"].startswith("attention/kernel") and not t["exact"] for t in calibration.rows())


def test_an_attention_kernel_that_fails_is_a_recorded_fallback_with_one_warning(monkeypatch):
    emulate_gpu(monkeypatch, attention=True, linear_rows=None)

    def broken(*args, **kwargs):
        raise RuntimeError("Failed to compile kernel: (emulated)")

    _on_cuda(monkeypatch, broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calibration = calibrate(_tiny(), [3, 4], measure=False, boundary=False, save=False)
    assert all(calibration.level_for(w) == "attention" for w in (3, 4))
    failed = [t for t in calibration.rows() if t["level"].startswith("attention/kernel")]
    assert failed and all(not t["exact"] and "emulated" in t["error"] for t in failed)
    assert sum("attention_rows is not used" in str(w.message) for w in caught) == 1


def test_the_level_parses_and_combines():
    from specbench.exact import ExactPlan

    plan = ExactPlan.parse("attention/kernel+linear/kernel")
    assert plan.attention == "kernel" and plan.linear == "kernel" and plan.name == "attention/kernel+linear/kernel"
    assert exact_calibration._combine({"attention": "kernel", "linear": "linear/kernel"}, moe=False) == plan.name
    assert exact_calibration._combine({"attention": "split"}, moe=False) == "attention+linear"
    with pytest.raises(ValueError, match="attention\\[/kernel\\]"):
        ExactPlan.parse("attention/fast")


# -- on the GPU ------------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not kernels.cuda_available(), reason="the attention kernel is CUDA")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,head_dim", [(mx.bfloat16, 128), (mx.bfloat16, 64), (mx.float16, 128)])
def test_every_row_equals_mlx_one_query_attention_on_the_gpu(dtype, head_dim):
    variant = kernels.attention_variant(dtype, head_dim)
    found = {v: kernels.attention_matches(dtype, head_dim, v, rows=(1, 2, 9, 16)) for v in kernel_attention.VARIANTS}
    print(f"\n{dtype} D={head_dim}: variant {variant}; " + ", ".join(f"{v} {r['exact']}" for v, r in found.items()))
    assert variant is not None, found
    assert found[variant]["exact"]


#: The GPU test's batches: (prefix, rows), one pass; two passes.
BATCHES = [(40, 1), (300, 4), (1500, 3)]


def _starts(prefix: int) -> list[int]:
    """Four batch rows' first keys (mlx-lm's left padding), none past the prefix: each row keeps a key or more."""
    return [min(s, prefix) for s in (0, 3, 31, 130)]


@pytest.mark.parametrize("prefix,rows", BATCHES)
def test_the_gpu_batches_are_inputs_the_kernel_takes(prefix, rows):
    """On any device: the batches the GPU test below gives the kernel pass its input check (a start past the keys
    would be refused with a ValueError there, not test the kernel)."""
    q, k, v = _batch_block(mx.bfloat16, 128, _starts(prefix), prefix, rows)
    assert kernel_attention.check_inputs(q, k, v, "causal" if rows > 1 else None, _starts(prefix)) is None


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,head_dim", [(mx.bfloat16, 128), (mx.float16, 64)])
@pytest.mark.parametrize("prefix,rows", BATCHES)
def test_with_starts_every_batch_row_equals_mlx_one_query_attention_over_its_keys_on_the_gpu(
    dtype, head_dim, prefix, rows
):
    variant = kernels.attention_variant(dtype, head_dim)
    assert variant is not None
    starts = _starts(prefix)
    q, k, v = _batch_block(dtype, head_dim, starts, prefix, rows)
    scale = head_dim**-0.5
    mask = "causal" if rows > 1 else None
    got = _host(kernels.attention_rows(q, k, v, scale, mask, variant, starts=starts))
    reference = _host(attention_rows_reference(q, k, v, scale, mask, starts=starts))
    ulp = 2**-7 if dtype == mx.bfloat16 else 2**-10
    assert np.abs(got - reference).max() <= 2 * ulp * np.abs(reference).max()
    n = prefix + rows
    for b, s in enumerate(starts):
        for i in range(rows):
            end = n - rows + i + 1
            one = mx.fast.scaled_dot_product_attention(
                mx.contiguous(q[b : b + 1, :, i : i + 1]), k[b : b + 1, :, s:end], v[b : b + 1, :, s:end], scale=scale
            )
            assert np.array_equal(got[b : b + 1, :, i : i + 1], _host(one)), (b, i)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("n_keys", [256, 2048, 8192])
def test_the_kernel_speed_at_nine_rows_on_the_gpu(n_keys):
    from scripts.gpu.kernel_bench import bench_attention

    variant = kernels.attention_variant(mx.bfloat16, 128)
    assert variant is not None
    row = bench_attention(n_keys, rows=9, variant=variant)
    print(
        f"\nQwen3-8B attention, {n_keys} keys, 9 rows: kernel {row['kernel_9_us']:.1f} us, "
        f"9 one-query calls {row['mlx_split_9_us']:.1f} us, MLX 9-query {row['mlx_9_us']:.1f} us, "
        f"kernel 1 {row['kernel_1_us']:.1f} us vs MLX 1 {row['mlx_1_us']:.1f} us"
    )
    assert row["kernel_9_us"] > 0
