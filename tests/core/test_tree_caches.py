"""Token trees on other caches and draft heads: quantized KV compaction, rows with their own mask and positions."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import build_tiny
from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache

from specbench.core.engine import plain_generation
from specbench.core.options import GenerateOptions
from specbench.core.target import ModelTarget
from specbench.core.tree import row_attention, tree_mask

PROMPT = [5, 9, 13, 2, 7]


def quantized_cache(model, bits: int = 8) -> list[QuantizedKVCache]:
    return [QuantizedKVCache(group_size=32, bits=bits) for _ in model.layers]


def serial_logits(model, cache, tokens) -> list[mx.array]:
    return [model(mx.array([[t]]), cache=cache)[0, -1] for t in tokens]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_quantized_kv_compaction_leaves_the_serial_quantized_cache(arch):
    """With a QuantizedKVCache (8-bit, groups of 32: heads of 32) every key/value row is quantized on its own, so
    after a tree verification (in exact mode, every op split) the compacted cache (data, scales and biases) equals
    the cache serial decoding of the accepted tokens fills, bit for bit, and the emitted tokens are the
    serial greedy ones over the quantized cache."""
    from specbench.exact import ExactVerifier

    model = build_tiny(arch, head_dim=32)
    serial = quantized_cache(model)
    model(mx.array([PROMPT]), cache=serial)
    truth = []
    # The greedy continuation over the quantized cache (serial, one token at a time).
    probe = quantized_cache(model)
    out = model(mx.array([PROMPT]), cache=probe)[0, -1]
    for _ in range(5):
        truth.append(int(mx.argmax(out).item()))
        out = model(mx.array([[truth[-1]]]), cache=probe)[0, -1]

    def wrong(t):
        return (t + 1) % 97

    tokens = [wrong(truth[1]), wrong(truth[2]), truth[1], wrong(truth[2]), truth[2], truth[3]]
    parents = [-1, 0, -1, 2, 2, 4]
    cache = quantized_cache(model)
    target = ModelTarget(
        model, GenerateOptions(max_tokens=20), ExactVerifier(model, "all"), prompt_cache=cache, speculative=True
    )
    with target.running():
        first = target.prefill(PROMPT, 0)[0]
        assert first.tokens == truth[:1]
        step = target.verify(tokens, None, 1, parents=parents)
    assert step.path == [2, 4, 5] and step.tokens == truth[1:5]
    serial_logits(model, serial, truth[:4])
    for tree_cache, serial_cache in zip(target.cache, serial):
        assert tree_cache.offset == serial_cache.offset == len(PROMPT) + 4
        for name in ("keys", "values"):
            for a, b in zip(getattr(tree_cache, name), getattr(serial_cache, name)):
                assert mx.array_equal(a[..., : tree_cache.offset, :], b[..., : serial_cache.offset, :])


def test_quantized_kv_tree_decoding_equals_serial_quantized_decoding(fresh_calibrations):
    """End to end over a 4-bit quantized KV cache: a tree-drafting run (greedy: exact mode, calibrated on this
    device) emits the serial greedy tokens."""
    from test_tree import BranchingDrafter

    from specbench.core.engine import Generation
    from specbench.core.policies import DraftPolicy

    model = build_tiny("llama", head_dim=32)
    options = GenerateOptions(max_tokens=24)
    plain = list(plain_generation(model, PROMPT, options, prompt_cache=quantized_cache(model, 4)))
    gen = Generation(
        model,
        PROMPT,
        options,
        drafter=BranchingDrafter(plain, 97),
        policy=DraftPolicy.fixed(12),
        prompt_cache=quantized_cache(model, 4),
    )
    assert list(gen) == plain
    assert max(r.accepted for r in gen.log if r.kind == "verify") >= 2


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_row_attention_rows_equal_serial_decoding_along_their_paths(arch):
    """Rows fed level by level (a draft head's way): each row, with a mask over the context and its
    ancestors' cache entries and the position of its depth, computes what serial decoding along its
    own path computes."""
    model = build_tiny(arch)
    modules = [layer.self_attn for layer in model.model.layers]
    # Level 1: two rows (tokens 11, 12) at position 5; level 2: 21 under 11 and 22 under 12 at position 6.
    cache = make_prompt_cache(model)
    model(mx.array([PROMPT]), cache=cache)
    base = len(PROMPT)
    level1 = tree_mask([-1, -1])[1:, 1:]  # each row itself only
    mask1 = mx.concatenate([mx.ones((2, base), dtype=mx.bool_), level1], axis=1)
    with row_attention(modules, cache, mask1, [base, base]):
        out1 = model(mx.array([[11, 12]]), cache=cache)[0]
    mask2 = mx.array([[True] * base + [True, False, True, False], [True] * base + [False, True, False, True]])
    with row_attention(modules, cache, mask2, [base + 1, base + 1]):
        out2 = model(mx.array([[21, 22]]), cache=cache)[0]
    for first, second, row in ((11, 21, 0), (12, 22, 1)):
        serial = make_prompt_cache(model)
        model(mx.array([PROMPT]), cache=serial)
        a, b = serial_logits(model, serial, [first, second])
        assert mx.allclose(out1[row], a, atol=1e-4) and mx.allclose(out2[row], b, atol=1e-4)
    with pytest.raises(ValueError, match="columns"):
        with row_attention(modules, cache, mask2, [base, base]):
            model(mx.array([[1, 2]]), cache=cache)
