"""Exact batches: with ``verify="exact"`` every request's tokens equal its own single-request mlx-lm greedy output,
whatever else is in the batch and whenever it joined, on a device whose multi-row products round otherwise
(``conftest.emulate_gpu``: B requests x 1 row is multi-row too); the kernels' calls where the probe proved them;
bad input refused before any model work, calls no kernel takes counted as fallbacks."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import QWEN3_NEXT, ScriptedDrafter, build, build_tiny, emulate_gpu, plain_greedy

from specbench import DraftPolicy, GenerateOptions, generate_batch, speculative_generate_batch
from specbench import kernels as specbench_kernels
from specbench.core.batch import BatchGeneration
from specbench.exact import batch_verifier
from specbench.kernels import attention_rows_reference, cuda_available, gemv_rows_reference

#: Six prompts of different lengths (so each row's left padding differs).
PROMPTS = [[5, 17, 3], [9, 5, 17, 3, 9, 5, 17, 2, 2, 8, 40], [44, 2, 8, 5, 17], [3, 9], [8, 8, 5, 17, 44, 2], [17, 3]]
VOCAB = 97
TOKENS = 10
#: How far the emulated GPU's multi-row products round off (large enough to change tokens of these tiny models).
BUMP = 0.05


def cycling(row: int, k: int):
    """Row r's draft is wrong at position (r + step) mod (k + 1): in one step rows accept 0..k."""
    return lambda step, i: i == (row + step) % (k + 1)


def drafted(truth: list[list[int]], prompts: list[list[int]], k: int) -> list[ScriptedDrafter]:
    return [ScriptedDrafter(truth[r], len(p), VOCAB, cycling(r, k)) for r, p in enumerate(prompts)]


def speculative(model, prompts, truth, verify: str, max_batch: int, k: int = 3):
    options = GenerateOptions(max_tokens=len(truth[0]), verify=verify)
    return speculative_generate_batch(
        model, prompts, options, drafters=drafted(truth, prompts, k), policy=DraftPolicy.fixed(k), max_batch=max_batch
    )


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_fast_batches_diverge_from_single_request_greedy_on_an_emulated_gpu(monkeypatch, arch):
    model = build_tiny(arch)
    emulate_gpu(monkeypatch, size=BUMP, experts=True)
    truth = [plain_greedy(model, p, TOKENS) for p in PROMPTS]
    assert speculative(model, PROMPTS, truth, "fast", 4).run() != truth
    assert generate_batch(model, PROMPTS, GenerateOptions(max_tokens=TOKENS), max_batch=4).run() != truth


@pytest.mark.reference_blas  # must hold on either BLAS
@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
@pytest.mark.parametrize("batch", [1, 4])
def test_exact_batches_equal_each_requests_mlx_lm_greedy_on_an_emulated_gpu(monkeypatch, arch, batch):
    model = build_tiny(arch)
    emulate_gpu(monkeypatch, size=BUMP, experts=True)
    prompts = PROMPTS if batch > 1 else PROMPTS[:2]  # more prompts than slots: later ones join mid-run
    truth = [plain_greedy(model, p, TOKENS) for p in prompts]
    gen = speculative(model, prompts, truth, "exact", batch)
    assert gen.run() == truth
    assert max(s.batch_size for s in gen.batch_log) == batch
    assert any(s.kind == "verify" for s in gen.batch_log) and any(r.log.records[1].accepted < 3 for r in gen.requests)
    joined = [r.index for r in gen.requests if gen.batch_log[0].requests.count(r.index) == 0]
    assert joined  # some requests joined after the first step
    plain = generate_batch(model, prompts, GenerateOptions(max_tokens=TOKENS, verify="exact"), max_batch=batch)
    assert plain.run() == truth  # batched plain steps too
    assert plain.stats()["verify"] == "exact"
    # on the CPU no kernel is proved: every linear call fell back to the layer's own one-row calls, counted
    fallbacks = gen.stats()["kernel_fallbacks"]
    assert any(reason.startswith("linear: no gemv_rows variant proved") for reason in fallbacks)
    assert any(reason.startswith("attention: head dimension 16 is not one of") for reason in fallbacks)


# -- the kernels where the probe proved them -------------------------------------------------------------------------


def proved_kernels(monkeypatch) -> dict[str, list]:
    """Stand-ins for a device whose probe proved ``gemv_rows`` and ``attention_rows``: each computes every row as the
    one-row (one-query) call does, as the proved kernels do, and records its calls (rows, and starts)."""
    calls: dict[str, list] = {"gemv_rows": [], "attention_rows": []}
    sdpa = mx.fast.scaled_dot_product_attention  # before exact mode wraps it

    def gemv_rows(x, weight, accumulate):
        calls["gemv_rows"].append(x.size // x.shape[-1])
        flat = x.reshape(-1, x.shape[-1])
        out = mx.concatenate([flat[i : i + 1] @ weight.T for i in range(flat.shape[0])])
        reference = gemv_rows_reference(flat, weight)  # the kernel's arithmetic
        assert np.allclose(np.array(reference.astype(mx.float32)), np.array(out.astype(mx.float32)), 0.02, 0.05)
        return out.reshape(*x.shape[:-1], weight.shape[0])

    def attention_rows(q, k, v, scale, mask=None, variant="source", starts=None):
        calls["attention_rows"].append((q.shape[0] * q.shape[2], list(starts or [])))
        rows, n = q.shape[2], k.shape[2]
        out = mx.concatenate(
            [
                mx.concatenate(
                    [
                        sdpa(
                            mx.contiguous(q[b : b + 1, :, i : i + 1]),
                            k[b : b + 1, :, s : n - rows + i + 1],
                            v[b : b + 1, :, s : n - rows + i + 1],
                            scale=scale,
                        )  # fmt: skip
                        for i in range(rows)
                    ],
                    axis=2,
                )
                for b, s in enumerate(starts or [0] * q.shape[0])
            ]
        )
        reference = attention_rows_reference(q, k, v, scale, mask, starts=starts)  # the kernel's arithmetic
        assert np.allclose(np.array(reference.astype(mx.float32)), np.array(out.astype(mx.float32)), atol=0.05)
        return out

    monkeypatch.setattr(specbench_kernels, "gemv_variant", lambda dtype: "fma")
    monkeypatch.setattr(specbench_kernels, "gemv_rows", gemv_rows)
    monkeypatch.setattr(specbench_kernels, "attention_variant", lambda dtype, head_dim: "source")
    monkeypatch.setattr(specbench_kernels, "attention_rows", attention_rows)
    return calls


def bf16_model():
    """A tiny dense model the attention kernel computes (head dimension 64, bfloat16)."""
    model = build_tiny("qwen3", head_dim=64)
    model.set_dtype(mx.bfloat16)
    return model


@pytest.mark.parametrize("k", [3, 16])
def test_exact_batches_go_through_the_proved_kernels_and_count_what_they_do_not_take(monkeypatch, k):
    model = bf16_model()
    truth = [plain_greedy(model, p, TOKENS + k) for p in PROMPTS]
    calls = proved_kernels(monkeypatch)
    gen = speculative(model, PROMPTS, truth, "exact", 4, k)
    assert gen.run() == truth
    widths = {s.width for s in gen.batch_log}
    # every linear layer took all B·w rows in one call, every attention one call with each row's first key
    assert max(calls["gemv_rows"]) >= 4 * max(widths)
    assert any(rows >= 4 and any(starts) for rows, starts in calls["attention_rows"])
    fallbacks = gen.stats()["kernel_fallbacks"]
    assert not any(reason.startswith("linear") for reason in fallbacks)
    if k == 16:  # 17 query rows are past the attention kernel's 16: those layers ran row by row, counted
        wide = sum(s.width == 17 for s in gen.batch_log)
        assert wide and fallbacks == {"attention: 17 query rows: 1 to 16 are computed": 2 * wide}  # 2 layers
    else:
        assert fallbacks == {}


def test_a_kernel_probe_run_inside_a_batch_forward_calls_mlx_attention_as_mlx_runs_it(monkeypatch):
    """The attention probe runs on first use, inside a hooked forward: its one-query reference calls must not be
    taken for the batch's own attention (with the batch's row starts they were refused, and the probe failed)."""
    model = bf16_model()
    truth = [plain_greedy(model, p, TOKENS) for p in PROMPTS]
    proved_kernels(monkeypatch)
    sdpa = mx.fast.scaled_dot_product_attention  # before exact mode wraps it
    probes = []

    def probing_variant(dtype, head_dim):  # as kernels.probe: MLX's one-query attention on a batch of one
        q, k = (mx.random.normal((1, 2, n, head_dim), key=mx.random.key(n)).astype(dtype) for n in (1, 7))
        probes.append(
            mx.array_equal(
                mx.fast.scaled_dot_product_attention(q, k, k, scale=0.125), sdpa(q, k, k, scale=0.125)
            ).item()
        )
        return "source"

    monkeypatch.setattr(specbench_kernels, "attention_variant", probing_variant)
    gen = speculative(model, PROMPTS, truth, "exact", 4)
    assert gen.run() == truth
    assert probes and all(probes)
    assert gen.stats()["kernel_fallbacks"] == {}


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="the kernels are CUDA sources: run on a CUDA device")
def test_exact_batches_through_the_real_kernels_equal_mlx_lm_greedy_on_the_gpu():
    model = bf16_model()
    truth = [plain_greedy(model, p, TOKENS) for p in PROMPTS]
    gen = speculative(model, PROMPTS, truth, "exact", 4)
    assert gen.run() == truth
    fast = speculative(model, PROMPTS, truth, "fast", 4).run()
    print(f"\nfast batches equal to mlx-lm greedy: {sum(f == t for f, t in zip(fast, truth))} of {len(truth)}")
    assert gen.stats()["kernel_fallbacks"] == {}, "a proved kernel did not take a call"


# -- bad input -------------------------------------------------------------------------------------------------------


@pytest.fixture
def model():
    return build_tiny("llama")


def test_bad_input_is_refused_before_any_model_work(no_forward):
    mixed = [GenerateOptions(verify="exact"), GenerateOptions(), GenerateOptions(verify="fast")]
    with pytest.raises(ValueError, match=r"different verify modes \(exact for requests 0; fast for requests 2\)"):
        generate_batch(no_forward, PROMPTS[:3], mixed)
    with pytest.raises(ValueError, match="asks for exact verification, but this batch verifies in fast mode"):
        BatchGeneration(no_forward, PROMPTS[:2], GenerateOptions(verify="exact"))
    gen = generate_batch(no_forward, PROMPTS[:2], GenerateOptions(verify="exact"))
    with pytest.raises(ValueError, match="asks for fast verification, but this batch verifies in exact mode"):
        gen.add([3, 4], GenerateOptions(verify="fast"))
    hybrid = build(QWEN3_NEXT)
    with pytest.raises(ValueError, match="exact batched verification covers attention-only models"):
        BatchGeneration(hybrid, PROMPTS[:2], verifier=batch_verifier(hybrid, "exact"))
