"""On a CUDA device: every row of ``qmv_rows`` is MLX's one-row product, and the kernel is cheaper than
the row-invariant MLX calls it replaces (``pytest -m gpu``; skipped elsewhere)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from scripts.gpu.kernel_bench import MLX_INVARIANT_ROWS
from specbench.kernels import gemv_rows, gemv_variant, qmv_matches, qmv_rows, qmv_variant
from specbench.kernels.bench import per_call_seconds
from specbench.kernels.probe import cuda_available
from specbench.kernels.qmv import SCHEDULES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not cuda_available(), reason="the kernels are CUDA sources: run on a CUDA device"),
]


def _layer(n: int, k: int, dtype: mx.Dtype, bits: int, group_size: int):
    mx.random.seed(n + k + bits)
    weight = (mx.random.normal((n, k)) / k**0.5).astype(dtype)
    return mx.quantize(weight, group_size=group_size, bits=bits)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
@pytest.mark.parametrize("bits,group_size", [(4, 32), (4, 64), (4, 128), (8, 64)])
def test_every_row_is_mlx_one_row_product(dtype, bits, group_size):
    variant = qmv_variant(dtype, bits, group_size)
    assert variant is not None, "the probe found no variant of qmv_rows equal to MLX's one-row product"
    w, scales, biases = _layer(1024, 4096, dtype, bits, group_size)
    x = mx.random.normal((16, 4096)).astype(dtype)
    alone = [mx.quantized_matmul(x[i : i + 1], w, scales, biases, True, group_size, bits) for i in range(16)]
    expected = np.array(mx.concatenate(alone).astype(mx.float32))
    for rows in (1, 2, 7, 8, 9, 16):
        got = np.array(qmv_rows(x[:rows], w, scales, biases, group_size, bits, variant).astype(mx.float32))
        assert np.array_equal(got, expected[:rows]), f"{rows} rows differ from MLX's one-row products"


@pytest.mark.parametrize("dtype,bits,group_size", [(mx.bfloat16, 4, 64), (mx.bfloat16, 8, 64), (mx.float16, 4, 32)])
def test_every_schedule_reproduces_mlx_one_row_products(dtype, bits, group_size):
    """Each schedule on the probe's shapes (one whose K ends in a partial pass) at 1, 9 and 16 rows."""
    variant = qmv_variant(dtype, bits, group_size)
    assert variant is not None, "the probe found no variant of qmv_rows equal to MLX's one-row product"
    for schedule in SCHEDULES:
        found = qmv_matches(dtype, bits, group_size, variant, rows=(1, 9, 16), schedule=schedule)
        assert found["exact"], f"{schedule}: {found['mismatches']}"


@pytest.mark.parametrize("n,k", [(12288, 4096), (4096, 12288), (4096, 4096)])
def test_nine_rows_cost_less_than_the_invariant_calls_they_replace(n, k):
    w, scales, biases = _layer(n, k, mx.bfloat16, 4, 64)
    variant = qmv_variant(mx.bfloat16, 4, 64)
    x = mx.random.normal((9, k)).astype(mx.bfloat16)

    def invariant_chunks() -> mx.array:
        parts = [x[i : i + MLX_INVARIANT_ROWS] for i in range(0, 9, MLX_INVARIANT_ROWS)]
        return mx.concatenate([mx.quantized_matmul(p, w, scales, biases, True, 64, 4) for p in parts])

    kernel = per_call_seconds(lambda: qmv_rows(x, w, scales, biases, 64, 4, variant))
    mlx = per_call_seconds(invariant_chunks)
    print(f"{n}x{k}, 9 rows: qmv_rows {kernel * 1e6:.1f} us, MLX in invariant chunks {mlx * 1e6:.1f} us")
    assert kernel < mlx


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_every_gemv_row_is_mlx_one_row_product(dtype):
    variant = gemv_variant(dtype)
    assert variant is not None, "the probe found no accumulation of gemv_rows equal to MLX's one-row product"
    mx.random.seed(3)
    weight = (mx.random.normal((1024, 4096)) / 64).astype(dtype)
    x = mx.random.normal((16, 4096)).astype(dtype)
    expected = np.array(mx.concatenate([x[i : i + 1] @ weight.T for i in range(16)]).astype(mx.float32))
    for rows in (1, 2, 9, 16):
        got = np.array(gemv_rows(x[:rows], weight, variant).astype(mx.float32))
        assert np.array_equal(got, expected[:rows]), f"{rows} rows differ from MLX's one-row products"


def test_nine_gemv_rows_cost_less_than_nine_one_row_calls():
    weight = (mx.random.normal((12288, 4096)) / 64).astype(mx.bfloat16)
    x = mx.random.normal((9, 4096)).astype(mx.bfloat16)
    variant = gemv_variant(mx.bfloat16)
    kernel = per_call_seconds(lambda: gemv_rows(x, weight, variant))
    rows = per_call_seconds(lambda: mx.concatenate([x[i : i + 1] @ weight.T for i in range(9)]))
    print(f"12288x4096 bf16, 9 rows: gemv_rows {kernel * 1e6:.1f} us, 9 one-row MLX calls {rows * 1e6:.1f} us")
    assert kernel < rows


def test_plain_greedy_through_one_row_kernels_equals_mlx_lm():
    """Every layer forced through its one-row kernel: a one-token forward's logits are bit-identical to the
    model's own, greedy output equals mlx-lm's, and the kernel is faster on the device for a large LM head."""
    import mlx.nn as nn
    from mlx_lm.generate import generate_step
    from mlx_lm.models import qwen3
    from mlx_lm.models.cache import make_prompt_cache

    import specbench
    from specbench.exact.one_row import (
        OneRowChoice,
        ShapeTiming,
        _candidates,
        one_row_choice,
        one_row_kernels,
        signature,
    )

    args = qwen3.ModelArgs.from_dict(
        {
            "model_type": "qwen3",
            "hidden_size": 1024,
            "num_hidden_layers": 2,
            "intermediate_size": 3072,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "rms_norm_eps": 1e-6,
            "vocab_size": 151936,
            "max_position_embeddings": 4096,
            "rope_theta": 1e6,
            "tie_word_embeddings": False,
        }
    )
    mx.random.seed(0)
    model = qwen3.Model(args)
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=64, bits=4)
    mx.eval(model.parameters())
    forced = OneRowChoice([ShapeTiming(signature(layer), 1, 1.0, 0.0) for _, layer in _candidates(model)], 1.0, 0.0)
    prompt = [5, 17, 99, 1234, 42, 7]

    def one_token_logits() -> np.ndarray:
        cache = make_prompt_cache(model)
        model(mx.array(prompt[:-1])[None], cache=cache)
        return np.array(model(mx.array(prompt[-1:])[None], cache=cache).astype(mx.float32))

    expected = one_token_logits()
    with one_row_kernels(model, forced) as swapped:
        assert len(swapped) == len(_candidates(model))
        assert np.array_equal(one_token_logits(), expected)
    reference = [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=24)]
    gen = specbench.generate(model, prompt, specbench.GenerateOptions(max_tokens=24, ignore_eos=True))
    assert list(gen) == reference
    head = next(t for t in one_row_choice(model).shapes if t.signature[1] == 151936)
    assert head.kernel_s is not None and head.uses_kernel, f"LM head: MLX {head.mlx_s}, kernel {head.kernel_s}"
