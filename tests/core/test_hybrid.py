"""Hybrid models (Gated DeltaNet + attention): exact rollback of recurrent state after partial acceptance."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import QWEN3_NEXT, QWEN35, QWEN35_MOE, ScriptedDrafter, build, plain_greedy
from mlx_lm.models.cache import make_prompt_cache

from specbench import DraftPolicy, GenerateOptions, speculative_generate
from specbench.core.verify import CacheRollback

PROMPT = [5, 17, 3, 9, 5, 17, 3, 9, 5, 17, 44, 2, 8]
N = 30
VOCAB = 101

MODELS = {"qwen3_5": QWEN35, "qwen3_5_moe": QWEN35_MOE, "qwen3_next": QWEN3_NEXT}


@pytest.fixture(scope="module", params=list(MODELS))
def hybrid(request):
    model = build(MODELS[request.param])
    return model, plain_greedy(model, PROMPT, N)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_every_acceptance_count_equals_plain(hybrid, k):
    """The draft is wrong at position (step mod (k+1)): verifications accept 0..k tokens in turn."""
    model, ref = hybrid
    drafter = ScriptedDrafter(ref, len(PROMPT), VOCAB, wrong_at=lambda step, i: i == step % (k + 1))
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=N, verify="fast"), drafter=drafter, policy=DraftPolicy.fixed(k)
    )
    assert list(gen) == ref
    seen = {r.accepted for r in gen.log if r.kind == "verify" and r.k_drafted == k}
    assert seen == set(range(k + 1))


def test_exact_verify_equals_plain(hybrid):
    model, ref = hybrid
    drafter = ScriptedDrafter(ref, len(PROMPT), VOCAB, wrong_at=lambda step, i: i == step % 4)
    gen = speculative_generate(
        model, PROMPT, GenerateOptions(max_tokens=N, verify="exact"), drafter=drafter, policy=DraftPolicy.fixed(3)
    )
    assert list(gen) == ref


def test_recording_is_bounded_and_removed():
    model = build(QWEN35)
    cache = make_prompt_cache(model)
    model(mx.array([PROMPT]), cache=cache)
    rollback = CacheRollback(cache, model)
    mixer_types = {i: type(m) for i, m in rollback.recorder.mixers.items()}
    for width, rejected in [(4, 2), (6, 5), (3, 0)]:
        rollback.before_verify(width)
        model(mx.array([[1] * width]), cache=cache)
        assert all(len(r["states"]) == width and len(r["conv"]) == width for r in rollback.recorder.records.values())
        rollback.rewind(rejected)
        assert rollback.recorder.records == {}
        assert {i: type(m) for i, m in rollback.recorder.mixers.items()} == mixer_types
    # 13 prompt tokens + 2 + 1 + 3 accepted.
    offsets = {c.offset for c in cache if c.is_trimmable()}
    assert offsets == {len(PROMPT) + 6}


def test_state_after_rewind_equals_serial_steps():
    """A verification rewound to its accepted rows leaves the recurrent state serial steps leave: the forward runs
    in exact mode with every op split (each row as a serial step computes it, on any device)."""
    from specbench.exact import exact_mode

    model = build(QWEN35_MOE)
    tokens = [7, 3, 9, 11, 2]
    cache = make_prompt_cache(model)
    model(mx.array([PROMPT]), cache=cache)
    serial = make_prompt_cache(model)
    model(mx.array([PROMPT]), cache=serial)
    for t in tokens[:2]:
        model(mx.array([[t]]), cache=serial)
    rollback = CacheRollback(cache, model)
    rollback.before_verify(len(tokens))
    with exact_mode(model, "all"):
        model(mx.array([tokens]), cache=cache)
    rollback.rewind(len(tokens) - 2)
    for c, s in zip(cache, serial):
        if not c.is_trimmable():
            assert mx.array_equal(c[0], s[0]) and mx.array_equal(c[1], s[1])
        else:
            assert c.offset == s.offset


def test_hybrid_needs_the_model():
    model = build(QWEN35)
    with pytest.raises(ValueError, match=r"pass the model"):
        CacheRollback(make_prompt_cache(model))


def test_unsupported_recurrent_layer_is_refused():
    from mlx_lm.models import mamba

    args = mamba.ModelArgs(
        model_type="mamba",
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        state_size=8,
        num_hidden_layers=2,
        conv_kernel=4,
        use_bias=False,
        use_conv_bias=True,
        time_step_rank=4,
    )
    model = mamba.Model(args)
    with pytest.raises(ValueError, match=r"cannot roll back.*Gated DeltaNet"):
        CacheRollback(make_prompt_cache(model), model)
