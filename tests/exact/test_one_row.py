"""Plain steps through the one-row kernels where the device measured them faster: which layer shapes are chosen,
that one-row calls (and only those) reach the kernel, that greedy output is unchanged, and that the model gets its
own layers back."""

from __future__ import annotations

import itertools

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import ScriptedDrafter, build_tiny, plain_greedy

import specbench
from specbench import DraftPolicy, GenerateOptions
from specbench.exact import one_row
from specbench.exact.one_row import OneRowChoice, ShapeTiming, one_row_choice, one_row_kernels, signature


def quantized_tiny() -> nn.Module:
    model = build_tiny("qwen3", num_hidden_layers=2)
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def scripted_choice(monkeypatch, kernel_step: float):
    """``one_row_choice`` on CUDA (pretended) with scripted timings: the LM head (97 outputs) gains a lot on the
    device, the 128-wide MLP ties, the rest has no kernel; plain steps take 1.0 s, ``kernel_step`` with kernels."""
    model = quantized_tiny()
    monkeypatch.setattr(one_row.kernels, "cuda_available", lambda: True)
    monkeypatch.setattr(one_row, "_timings", {})
    monkeypatch.setattr(one_row, "_choices", {})
    timed, steps = [], []

    def timer(layer, layers):
        timed.append(signature(layer))
        n = signature(layer)[1]
        return ShapeTiming(signature(layer), layers, 1.0, 0.5 if n == 97 else 0.99 if n == 128 else None)

    def step_timer(m):
        steps.append(type(m.lm_head).__name__)
        return kernel_step if type(m.lm_head) is one_row.OneRowKernel else 1.0

    return model, one_row_choice(model, timer, step_timer), timed, steps


def test_choice_times_each_shape_once_and_keeps_kernels_that_make_plain_steps_faster(monkeypatch):
    model, choice, timed, steps = scripted_choice(monkeypatch, kernel_step=0.8)
    assert len(timed) == len(set(timed)) == len(choice.shapes)
    assert sum(t.layers for t in choice.shapes) == len(one_row._candidates(model))
    assert {sig[1] for sig in choice.signatures} == {97}  # the near tie keeps MLX's product
    assert steps == ["QuantizedLinear", "OneRowKernel"] * 3  # alternating rounds, the model's own layers after
    assert choice.step_s == 1.0 and choice.kernel_step_s == 0.8
    assert one_row_choice(model, lambda *a: pytest.fail("timed twice")) is choice  # once per process


def test_kernels_faster_per_call_but_not_per_step_are_not_used(monkeypatch):
    model, choice, _, _ = scripted_choice(monkeypatch, kernel_step=0.99)  # host-bound: the device's gain is lost
    assert not choice.confirmed and choice.signatures == set()
    with one_row_kernels(model, choice) as swapped:
        assert swapped == []


def test_a_kernel_whose_result_differs_on_the_layers_own_shape_is_not_chosen(monkeypatch):
    """The probe proves the kernel on small shapes; a layer shape whose kernel result differs from MLX's keeps MLX's
    product however fast the kernel is."""
    model = quantized_tiny()
    monkeypatch.setattr(one_row.kernels, "cuda_available", lambda: True)
    monkeypatch.setattr(one_row, "_timings", {})
    monkeypatch.setattr(one_row, "_choices", {})
    clock = itertools.cycle([1.0, 0.5])  # time_one_row times MLX's product, then the kernel: the kernel is faster
    monkeypatch.setattr(one_row, "per_call_seconds", lambda *a, **k: next(clock))
    head = signature(model.lm_head)

    def kernel(layer, x):  # fast, and one ulp off on the head's shape only
        out = layer(x)
        return out + mx.finfo(out.dtype).eps * mx.abs(out) if signature(layer) == head else out

    monkeypatch.setattr(one_row, "kernel_product", kernel)
    timings = {t.signature: t for t in one_row_choice(model, step_timer=lambda m: 1.0).shapes}
    assert timings[head].identical is False and not timings[head].uses_kernel
    assert all(t.identical and t.uses_kernel for sig, t in timings.items() if sig != head)


def test_the_identity_check_compares_the_kernel_with_mlx_on_the_layer_itself(monkeypatch):
    layer = quantized_tiny().lm_head
    monkeypatch.setattr(one_row, "per_call_seconds", lambda *a, **k: 1.0)
    monkeypatch.setattr(one_row, "kernel_product", lambda lay, x: lay(x))
    assert one_row.time_one_row(layer).identical is True
    monkeypatch.setattr(one_row, "kernel_product", lambda lay, x: lay(x) * 1.5)
    assert one_row.time_one_row(layer).identical is False
    monkeypatch.setattr(one_row, "kernel_product", lambda lay, x: None)
    assert one_row.time_one_row(layer).identical is None


def test_a_sharded_model_keeps_mlx_products(monkeypatch):
    """Ranks timing apart could choose differently and run different forwards: a sharded model is not timed."""
    model = quantized_tiny()
    model.specbench_group = (2, "ring")
    monkeypatch.setattr(one_row.kernels, "cuda_available", lambda: True)
    choice = one_row_choice(model, lambda *a: pytest.fail("timed a sharded model"))
    assert choice.shapes == [] and choice.signatures == set()


def test_off_cuda_nothing_is_timed_or_swapped():
    model = quantized_tiny()
    choice = one_row_choice(model, lambda *a: pytest.fail("timed off CUDA"))
    assert choice.shapes == [] and choice.signatures == set()
    with one_row_kernels(model) as swapped:
        assert swapped == []


@pytest.fixture
def kernel_calls(monkeypatch):
    """The kernel replaced by the layer's own product, recording the shape of every input it gets."""
    seen: list[tuple[int, ...]] = []

    def fake_kernel(layer, x):
        seen.append(tuple(x.shape))
        return layer(x)

    monkeypatch.setattr(one_row, "kernel_product", fake_kernel)
    return seen


def faster_head(model) -> OneRowChoice:
    return OneRowChoice([ShapeTiming(signature(model.lm_head), 1, 1.0, 0.5)], step_s=1.0, kernel_step_s=0.5)


def test_plain_greedy_runs_one_row_products_through_the_kernel_and_is_unchanged(monkeypatch, kernel_calls):
    model = quantized_tiny()
    prompt = [3, 14, 15, 92, 65, 35]
    expected = plain_greedy(model, prompt, 12)
    monkeypatch.setattr(one_row, "one_row_choice", faster_head)
    gen = specbench.generate(model, prompt, GenerateOptions(max_tokens=12, ignore_eos=True))
    assert list(gen) == expected
    assert kernel_calls and all(shape[:-1] == (1, 1) for shape in kernel_calls)
    assert len(kernel_calls) >= 11  # every plain step's head (the prompt's wider pass keeps MLX's product)
    assert type(model.lm_head) is nn.QuantizedLinear  # its own layer back


def test_sampling_and_fast_mode_keep_the_models_own_calls(monkeypatch, kernel_calls):
    model = quantized_tiny()
    monkeypatch.setattr(one_row, "one_row_choice", faster_head)
    list(specbench.generate(model, [3, 14, 15], GenerateOptions(max_tokens=4, verify="fast", ignore_eos=True)))
    list(specbench.generate(model, [3, 14, 15], GenerateOptions(max_tokens=4, temperature=0.7, ignore_eos=True)))
    assert kernel_calls == []


def test_speculative_exact_with_one_row_kernels_equals_plain_greedy(monkeypatch, kernel_calls, fresh_calibrations):
    model = quantized_tiny()
    prompt = [3, 14, 15, 92, 65, 35]
    expected = plain_greedy(model, prompt, 16)
    monkeypatch.setattr(one_row, "one_row_choice", faster_head)
    drafter = ScriptedDrafter(expected, len(prompt), 97, wrong_at=lambda step, i: step % 2 == 1 and i == 1)
    options = GenerateOptions(max_tokens=16, ignore_eos=True)
    gen = specbench.speculative_generate(
        model, prompt, options, drafter=drafter, policy=DraftPolicy.fixed(3), progress=None
    )
    assert list(gen) == expected
    assert gen.stats()["verifies"] > 0
    assert kernel_calls and all(shape[:-1] == (1, 1) for shape in kernel_calls)
    assert type(model.lm_head) is nn.QuantizedLinear


def test_plain_step_seconds_times_pipelined_greedy_steps():
    model = quantized_tiny()
    seconds = one_row.plain_step_seconds(model, steps=4)
    assert 0 < seconds < 5


def test_calibration_inside_the_one_row_kernels_holds_levels_against_mlxs_own_products(monkeypatch, fresh_calibrations):
    """A width first used during generation is calibrated inside ``one_row_kernels``: its serial reference must be
    MLX's own one-row products, not the kernel's (a kernel off by one ulp there would fail every level)."""
    from specbench.exact import calibrate

    model = quantized_tiny()
    outside = calibrate(model, [3], save=False, measure=False).level_for(3)
    off_by_an_ulp = []

    def kernel(layer, x):
        off_by_an_ulp.append(tuple(x.shape))
        out = layer(x)
        return out + mx.abs(out) * 2**-20

    monkeypatch.setattr(one_row, "kernel_product", kernel)
    with one_row_kernels(model, faster_head(model)) as swapped:
        assert swapped == ["lm_head"]
        inside = calibrate(model, [3], force=True, save=False, measure=False).level_for(3)
        assert type(model.lm_head) is one_row.OneRowKernel  # the generation's layers back after calibrating
    assert inside == outside != "serial"
    assert off_by_an_ulp == []  # no serial reference step went through the kernel


def test_kernels_whose_plain_logits_differ_from_mlxs_are_not_used(monkeypatch):
    """Random rows may not reach what the model's real activations do: the choice also compares whole plain steps'
    logits with and without the kernels, bit for bit, and keeps MLX's products where they differ."""
    model, choice, _, _ = scripted_choice(monkeypatch, kernel_step=0.5)
    assert choice.identical is True and choice.signatures  # the stand-in kernel is the layer's own product
    monkeypatch.setattr(one_row, "kernel_product", lambda layer, x: layer(x) * (1 + 2**-7))
    monkeypatch.setattr(one_row, "_choices", {})
    with pytest.warns(UserWarning, match="not bit-identical"):
        again = one_row_choice(model, step_timer=lambda m: 0.5 if type(m.lm_head) is one_row.OneRowKernel else 1.0)
    assert again.kernel_step_s < again.step_s  # faster, and still not used
    assert again.identical is False and not again.confirmed and again.signatures == set()
