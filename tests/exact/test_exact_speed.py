"""What exact mode does to save time stays exact: compiled linear chunks, and plain steps that lay the KV
buffers out once after each verification instead of at every step."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import ScriptedDrafter, build_tiny, plain_greedy
from mlx_lm.models.cache import KVCache, make_prompt_cache

from specbench.exact import ExactVerifier, exact_mode
from specbench.exact import hooks as exact_hooks
from specbench.exact.layout import serial_extent


def logits(model, cache, tokens, level=None, compiled=False) -> np.ndarray:
    if level is None:
        rows = [model(tokens[:, i : i + 1], cache=cache)[0, 0] for i in range(tokens.shape[1])]
        out = mx.stack(rows)
    else:
        with exact_mode(model, level, compiled=compiled):
            out = model(tokens, cache=cache)[0]
    for c in cache:
        c.trim(tokens.shape[1])
    return np.array(out.astype(mx.float32))


@pytest.mark.parametrize("quantize", [False, True])
def test_compiled_linear_chunks_equal_uncompiled_and_serial(quantize):
    import mlx.nn as nn

    model = build_tiny("qwen3", num_hidden_layers=2)
    if quantize:
        nn.quantize(model, group_size=32, bits=4)
        mx.eval(model.parameters())
    rng = np.random.default_rng(1)
    cache = make_prompt_cache(model)
    model(mx.array(rng.integers(0, 97, 20))[None], cache=cache)
    tokens = mx.array(rng.integers(0, 97, 7))[None]
    exact_hooks._compiled_products.clear()
    for width in (2, 5, 7):
        serial = logits(model, cache, tokens[:, :width])
        plain = logits(model, cache, tokens[:, :width], "attention+linear/3")
        compiled = logits(model, cache, tokens[:, :width], "attention+linear/3", compiled=True)
        assert np.array_equal(compiled, plain) and np.array_equal(compiled, serial), width
    kinds = {key[0] for key in exact_hooks._compiled_products}
    assert kinds == {"quantized" if quantize else "linear"}  # the compiled path ran
    assert not exact_hooks._installed and not exact_hooks._contexts


def test_plain_steps_lay_the_buffers_out_once_after_each_verification(monkeypatch):
    from specbench import DraftPolicy, GenerateOptions
    from specbench.core.engine import Generation

    model = build_tiny("llama", seed=2)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 97, 244)]  # decoding crosses 256 keys
    truth = plain_greedy(model, prompt, 40)
    layouts = []
    lay_out = exact_hooks.serial_kv_layout

    def counted(cache, width=1):  # the plain steps' layouts (a verification's forward lays out inside the split)
        if not exact_hooks._contexts:
            layouts.append(width)
        return lay_out(cache, width)

    monkeypatch.setattr(exact_hooks, "serial_kv_layout", counted)
    checked = []

    class Checked(ExactVerifier):
        def before_plain_step(self, cache):
            super().before_plain_step(cache)
            for c in cache:
                if type(c) is KVCache and c.keys is not None:
                    # serial decoding's buffer: as it is before this step, or as this step grows it
                    assert c.keys.shape[2] in (serial_extent(c.offset), serial_extent(c.offset + 1))
            checked.append(1)

    # three drafts in four wholly wrong (Adaptive then pauses 1, 2, 4 steps), the fourth partly accepted
    drafter = ScriptedDrafter(truth, len(prompt), 97, wrong_at=lambda step, i: step % 4 != 3 or i == 2)
    gen = Generation(
        model,
        prompt,
        GenerateOptions(max_tokens=40, ignore_eos=True),
        drafter=drafter,
        policy=DraftPolicy.adaptive(4, max_pause=4),
        verifier=Checked(model, widths=range(2, 6)),
    )
    assert list(gen) == truth
    verifies = sum(1 for r in gen.log.records if r.kind == "verify")
    assert len(checked) > 10 and len(layouts) <= verifies + 1 < len(checked)


def test_exact_mode_reads_its_calibration_once_per_generation(monkeypatch):
    """Every verification of a generation runs the plans prepared when it started: the calibration is read once
    per generation, whatever the number and widths of its verifications."""
    from specbench import DraftPolicy, GenerateOptions
    from specbench.core.engine import Generation
    from specbench.exact import calibration

    model = build_tiny("llama", seed=2)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 97, 20)]
    truth = plain_greedy(model, prompt, 30)
    verifier = ExactVerifier(model, widths=range(2, 6))  # calibrated up front
    reads = []
    original = calibration.load_calibration
    monkeypatch.setattr(calibration, "load_calibration", lambda m: reads.append(1) or original(m))
    widths = set()
    for generation in range(2):
        # one draft position wrong in each of the first three steps of four: verifications of several widths
        drafter = ScriptedDrafter(truth, len(prompt), 97, wrong_at=lambda step, i: i == step % 4)
        gen = Generation(
            model,
            prompt,
            GenerateOptions(max_tokens=30, ignore_eos=True),
            drafter=drafter,
            policy=DraftPolicy.fixed(4),
            verifier=verifier,
        )
        assert list(gen) == truth
        verifies = [r for r in gen.log.records if r.kind == "verify"]
        widths |= {r.verify_width for r in verifies}
        assert len(verifies) >= 5 and len(reads) == generation + 1
    assert len(widths) >= 2
