"""Exact verify mode: a width-w forward equals w single-token steps, bit for bit.

The CPU computes a w-row forward bit-identically to serial steps by itself, so besides checking
every level on real (tiny) models, these tests emulate a GPU: multi-row calls of attention,
linear layers or MoE experts are made to return slightly different numbers than single-row
calls (as other kernels do on a GPU). Exact mode must then still match serial decoding, the
plain batched forward must not, and calibration must find the cheapest level that is exact.
"""

from __future__ import annotations

import json
import os
import warnings

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import BATCHED_FORWARDS_ROW_INVARIANT, bitwise_forwards, build_tiny, bump, emulate_gpu, plain_greedy
from mlx_lm.models import base as mlx_base
from mlx_lm.models.cache import make_prompt_cache

from specbench.common.blas import blas_in_use, is_reference
from specbench.exact import (
    CUDNN_ATTENTION_ENV,
    Calibration,
    ExactPlan,
    ExactVerifier,
    WidthCalibration,
    calibrate,
    calibration_key,
    cudnn_attention,
    exact_mode,
    load_calibration,
    probe_ops,
    serial_kv_layout,
)
from specbench.exact import calibration as exact_calibration
from specbench.exact import hooks as exact_hooks
from specbench.exact import layout as exact_layout
from specbench.exact import verifier as exact_verifier
from specbench.exact.layout import with_extent

#: Levels that split every op whose result may depend on the number of rows (attention, linear layers; experts
#: row by row or per token): exact on any device.
SPLIT_LEVELS = ["attention+linear", "all", "serial", "attention+linear+experts/unsorted"]
#: Levels that batch some of those ops: exact where batched forwards are row-invariant (the CPU on MLX's
#: reference BLAS), not on an optimized BLAS or a GPU.
BATCHED_LEVELS = ["none", "attention", "attention+linear/vector+experts/unsorted", "attention+linear/3+experts/2"]
PREFIX = 21
WIDTH = 8


pytestmark = pytest.mark.usefixtures("fresh_calibrations")


def patch_exact(monkeypatch, name: str, value) -> None:
    """Replace ``name`` in every module of specbench.exact that defines or imports it."""
    for module in (exact_layout, exact_hooks, exact_calibration, exact_verifier):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, value)


def prefilled(model, seed: int = 0):
    rng = np.random.default_rng(seed)
    vocab = model.args.vocab_size
    cache = make_prompt_cache(model)
    model(mx.array(rng.integers(0, vocab, PREFIX))[None], cache=cache)
    tokens = mx.array(rng.integers(0, vocab, WIDTH))[None]
    return cache, tokens


def serial_logits(model, cache, tokens) -> np.ndarray:
    rows = [np.array(model(tokens[:, i : i + 1], cache=cache)[0, 0].astype(mx.float32)) for i in range(tokens.shape[1])]
    for c in cache:
        c.trim(tokens.shape[1])
    return np.stack(rows)


def verify_logits(model, cache, tokens, level: str | None) -> np.ndarray:
    if level is None:
        out = model(tokens, cache=cache)
    else:
        with exact_mode(model, level):
            out = model(tokens, cache=cache)
    out = np.array(out[0].astype(mx.float32))
    for c in cache:
        c.trim(tokens.shape[1])
    return out


def quantized(model, group_size: int = 32):
    nn.quantize(model, group_size=group_size, bits=4)
    mx.eval(model.parameters())
    return model


MODELS = ("llama", "qwen3", "qwen3_moe", "llama-bf16", "qwen3-4bit")


def make_model(name: str):
    """float32 dense and MoE models, a bfloat16 one, and a 4-bit one."""
    if name == "llama-bf16":
        model = build_tiny("llama")
        model.set_dtype(mx.bfloat16)
        mx.eval(model.parameters())
        return model
    if name == "qwen3-4bit":
        return quantized(build_tiny("qwen3"))
    return build_tiny(name)


def assert_levels_equal_serial_steps(name: str, levels: list[str]) -> None:
    model = make_model(name)
    cache, tokens = prefilled(model)
    reference = serial_logits(model, cache, tokens)
    for level in levels:
        for w in range(1, WIDTH + 1):
            got = verify_logits(model, cache, tokens[:, :w], level)
            assert np.array_equal(got, reference[:w]), (name, level, w)


@pytest.mark.parametrize("name", list(MODELS))
def test_split_levels_equal_serial_steps(name):
    assert_levels_equal_serial_steps(name, SPLIT_LEVELS)


@bitwise_forwards
@pytest.mark.parametrize("name", list(MODELS))
def test_batched_levels_equal_serial_steps_where_forwards_are_row_invariant(name):
    assert_levels_equal_serial_steps(name, BATCHED_LEVELS)


@pytest.mark.reference_blas
@pytest.mark.parametrize("name", list(MODELS))
def test_calibrated_levels_equal_serial_steps(name):
    """What exact mode runs on this device (its calibration's pick per width) is bit for bit serial decoding; on a
    device whose batched float32 forwards are not row-invariant (an optimized BLAS) it splits some width."""
    model = make_model(name)
    calibration = calibrate(model, WIDTH, measure=False)
    levels = {w: calibration.level_for(w) for w in range(2, WIDTH + 1)}
    if not BATCHED_FORWARDS_ROW_INVARIANT and name in ("llama", "qwen3", "qwen3_moe"):
        assert set(levels.values()) != {"none"}, levels
    cache, tokens = prefilled(model, seed=4)
    reference = serial_logits(model, cache, tokens)
    for w, level in levels.items():
        assert np.array_equal(verify_logits(model, cache, tokens[:, :w], level), reference[:w]), (w, level)


# -- emulating a GPU: multi-row kernels that round differently (conftest.emulate_gpu) ------------


def test_emulated_gpu_fast_differs_and_exact_levels_match(monkeypatch):
    model = build_tiny("qwen3")
    cache, tokens = prefilled(model)
    reference = serial_logits(model, cache, tokens)
    emulate_gpu(monkeypatch, attention=True, linear_rows=1)
    assert np.array_equal(serial_logits(model, cache, tokens), reference)  # single rows are unchanged
    for w in range(2, WIDTH + 1):
        assert not np.array_equal(verify_logits(model, cache, tokens[:, :w], None), reference[:w])
        assert not np.array_equal(verify_logits(model, cache, tokens[:, :w], "attention"), reference[:w])
        for level in ("attention+linear", "all", "serial", "attention+linear/vector"):
            assert np.array_equal(verify_logits(model, cache, tokens[:, :w], level), reference[:w]), (level, w)


def test_emulated_gpu_moe_needs_expert_split_when_tokens_are_sorted(monkeypatch):
    model = build_tiny("qwen3_moe", num_experts=16, num_experts_per_tok=8)
    cache, tokens = prefilled(model)
    reference = serial_logits(model, cache, tokens)
    emulate_gpu(monkeypatch, attention=True, linear_rows=1, experts=True)
    # 8 experts per token: mlx-lm sorts the routed tokens from 8 tokens on.
    assert np.array_equal(verify_logits(model, cache, tokens[:, :7], "attention+linear"), reference[:7])
    assert not np.array_equal(verify_logits(model, cache, tokens, "attention+linear"), reference)
    for level in ("all", "attention+linear+experts/unsorted", "serial"):
        assert np.array_equal(verify_logits(model, cache, tokens, level), reference), level


@bitwise_forwards
def test_calibration_picks_cheapest_exact_level_per_width(monkeypatch):
    # Linear kernels row-invariant up to 4 rows, attention never, the vector scheme not either.
    emulate_gpu(monkeypatch, attention=True, linear_rows=4, vector=True)
    model = build_tiny("qwen3")
    calibration = calibrate(model, WIDTH, measure=False)
    levels = {w: calibration.level_for(w) for w in range(1, WIDTH + 1)}
    assert levels == {
        1: "none",
        2: "attention",
        3: "attention",
        4: "attention",
        5: "attention+linear/4",
        6: "attention+linear/4",
        7: "attention+linear/4",
        8: "attention+linear/4",
    }
    tested = {(r["width"], r["level"]): r["exact"] for r in calibration.rows()}
    assert tested[(8, "none")] is False and tested[(8, "attention")] is False
    assert tested[(8, "attention+linear/vector")] is False and tested[(8, "attention+linear/4")] is True
    assert (8, "attention+linear/2") not in tested  # not tried once a cheaper scheme was exact
    # Each chosen level is bit-exact on this emulated device.
    cache, tokens = prefilled(model, seed=3)
    reference = serial_logits(model, cache, tokens)
    for w in range(2, WIDTH + 1):
        assert np.array_equal(verify_logits(model, cache, tokens[:, :w], levels[w]), reference[:w])


def test_calibration_for_moe_relaxes_experts_only_where_exact(monkeypatch):
    emulate_gpu(monkeypatch, attention=True, linear_rows=1, experts=True)
    model = build_tiny("qwen3_moe", num_experts=16, num_experts_per_tok=8)
    calibration = calibrate(model, [4, 8], measure=False)
    assert calibration.level_for(4) == "attention+linear/vector"
    assert calibration.level_for(8) == "attention+linear/vector+experts/unsorted"


def test_calibration_falls_back_to_serial_when_nothing_split_is_exact(monkeypatch):
    # A layer exact mode does not split (here the RMSNorm) that is row-dependent.
    original = nn.RMSNorm.__dict__["__call__"]

    def variant_norm(self, x):
        out = original(self, x)
        return bump(out) if x.ndim >= 2 and x.shape[-2] > 1 else out

    monkeypatch.setattr(nn.RMSNorm, "__call__", variant_norm)
    model = build_tiny("llama")
    calibration = calibrate(model, [3], measure=False)
    assert calibration.level_for(3) == "serial"
    cache, tokens = prefilled(model)
    reference = serial_logits(model, cache, tokens)
    assert np.array_equal(verify_logits(model, cache, tokens[:, :3], "auto"), reference[:3])


@pytest.mark.reference_blas
def test_calibration_is_exact_and_stored(tmp_path):
    """Measured calibration on this device: where batched forwards are row-invariant it keeps the batched forward
    (nothing else tested), elsewhere it picks a split level; either way each pick is exact, and stored."""
    model = build_tiny("llama")
    calibration = calibrate(model, 6, repeats=1)
    levels = {w: calibration.level_for(w) for w in range(2, 7)}
    if BATCHED_FORWARDS_ROW_INVARIANT:
        assert set(levels.values()) == {"none"}
        assert all(r["level"] == "none" for r in calibration.rows())  # nothing else needed testing
    else:
        assert set(levels.values()) != {"none"}, levels
    cache, tokens = prefilled(model, seed=3)
    reference = serial_logits(model, cache, tokens)
    for w, level in levels.items():
        assert np.array_equal(verify_logits(model, cache, tokens[:, :w], level), reference[:w]), (w, level)
    stored = list((tmp_path / "exact").glob("*.json"))
    assert len(stored) == 1
    exact_calibration._calibrations.clear()
    loaded = load_calibration(model)
    assert loaded is not None and loaded.to_json() == calibration.to_json()


def test_calibrations_of_two_processes_are_merged_on_disk(tmp_path):
    model = build_tiny("llama")
    calibrate(model, [2, 3], measure=False)
    other = Calibration.from_json(load_calibration(model).to_json())  # as another process holds it
    exact_calibration._calibrations.clear()
    calibrate(model, [4], measure=False)  # this process: reads the file, adds width 4
    other.widths.pop(2)
    other.widths[5] = WidthCalibration(5, "none")
    exact_calibration._save(other)  # the other process saves later, without width 2 and 4 in memory
    exact_calibration._calibrations.clear()
    assert sorted(load_calibration(model).widths) == [2, 3, 4, 5]


def test_measured_calibration_times_every_exact_candidate(monkeypatch):
    """Every exact candidate is timed and the cheapest chosen; serial steps are not timed against a split through
    MLX's own calls (never cheaper than it)."""
    emulate_gpu(monkeypatch, attention=True, linear_rows=1)
    model = build_tiny("qwen3")
    calibration = calibrate(model, [5], repeats=1)
    rows = [r for r in calibration.rows() if r["width"] == 5]
    exact_rows = [r for r in rows if r["exact"]]
    assert all(r["seconds"] is not None and r["seconds"] > 0 for r in exact_rows)
    assert exact_rows and not any(r["level"] == "serial" for r in rows)
    chosen = calibration.level_for(5)
    assert chosen == min(exact_rows, key=lambda r: r["seconds"])["level"]


def test_auto_level_calibrates_a_width_on_first_use(monkeypatch):
    emulate_gpu(monkeypatch, attention=True, linear_rows=1)
    model = build_tiny("qwen3")
    cache, tokens = prefilled(model)
    reference = serial_logits(model, cache, tokens)
    with exact_mode(model):  # level="auto"
        out = model(tokens[:, :5], cache=cache)
    assert np.array_equal(np.array(out[0]), reference[:5])
    assert sorted(load_calibration(model).widths) == [5]


# -- the mechanism ---------------------------------------------------------------------------


def test_split_attention_runs_each_row_as_one_query_over_its_prefix(monkeypatch):
    model = build_tiny("qwen3", num_hidden_layers=1)
    cache, tokens = prefilled(model)
    calls = []
    sdpa = mx.fast.scaled_dot_product_attention

    def spy(q, k, v, *args, mask=None, **kwargs):
        calls.append((q.shape[-2], k.shape[-2], mask))
        return sdpa(q, k, v, *args, mask=mask, **kwargs)

    def no_kernel(*args, **kwargs):
        raise AssertionError("the attention kernel's code ran under a level that does not name it")

    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(exact_hooks, "kernel_attention", no_kernel)
    with exact_mode(model, "attention"):
        mx.eval(model(tokens[:, :5], cache=cache))
    assert calls == [(1, PREFIX + i + 1, None) for i in range(5)]
    calls.clear()
    for c in cache:
        c.trim(5)
    mx.eval(model(tokens[:, :5], cache=cache))  # outside: one batched call
    assert calls == [(5, PREFIX + 5, "causal")]


def test_split_linear_calls_single_rows_and_patches_are_removed_after(monkeypatch):
    model = build_tiny("qwen3", num_hidden_layers=1)
    cache, tokens = prefilled(model)
    rows_seen = []
    original = nn.Linear.__dict__["__call__"]

    def spy(self, x):
        rows_seen.append(x.size // x.shape[-1])
        return original(self, x)

    monkeypatch.setattr(nn.Linear, "__call__", spy)
    with exact_mode(model, "attention+linear/3"):
        mx.eval(model(tokens[:, :7], cache=cache))
    # q, k, v, o, gate, up, down and lm_head: 7 rows as 3 + 3 + 1 each.
    assert sorted(set(rows_seen)) == [1, 3] and len(rows_seen) == 8 * 3
    assert nn.Linear.__dict__["__call__"] is spy
    assert mx.fast.scaled_dot_product_attention is not None
    assert "__wrapped__" not in dir(mx.fast.scaled_dot_product_attention)
    assert not exact_hooks._installed and not exact_hooks._contexts


def test_patches_are_removed_when_the_forward_raises():
    model = build_tiny("llama")
    linear = nn.Linear.__dict__["__call__"]
    with pytest.raises(RuntimeError, match="boom"):
        with exact_mode(model, "all"):
            raise RuntimeError("boom")
    assert nn.Linear.__dict__["__call__"] is linear
    assert mlx_base.quantized_scaled_dot_product_attention.__name__ == "quantized_scaled_dot_product_attention"
    assert not exact_hooks._installed and not exact_hooks._contexts


def test_hidden_states_and_logits_through_forward_are_exact(monkeypatch):
    model = build_tiny("qwen3")
    cache, tokens = prefilled(model)
    hidden_ref = []
    for i in range(WIDTH):
        hidden_ref.append(np.array(model.model(tokens[:, i : i + 1], cache=cache)[0, 0]))
    for c in cache:
        c.trim(WIDTH)
    reference = serial_logits(model, cache, tokens)
    emulate_gpu(monkeypatch, attention=True, linear_rows=1)
    for level in ("attention+linear", "serial"):
        verifier = ExactVerifier(model, level)
        logits, hidden = verifier.forward(model, tokens, cache, return_hidden=True)
        for c in cache:
            c.trim(WIDTH)
        assert np.array_equal(np.array(logits[0]), reference), level
        assert np.array_equal(np.array(hidden[0]), np.stack(hidden_ref)), level


@pytest.mark.skipif(
    mx.default_device().type == mx.DeviceType.gpu,
    reason="MLX's CUDA backend has no 8-bit quantized matmul for this tiny head size (21x21x32)",
)
def test_quantized_kv_cache_attention_is_split():
    model = build_tiny("llama", hidden_size=128)  # head_dim 32: one quantization group
    rng = np.random.default_rng(1)
    cache = [c.to_quantized(group_size=32, bits=8) for c in make_prompt_cache(model)]
    model(mx.array(rng.integers(0, 97, PREFIX))[None], cache=cache)
    tokens = mx.array(rng.integers(0, 97, 5))[None]
    reference = serial_logits(model, cache, tokens)
    calls = []
    original = mlx_base.quantized_scaled_dot_product_attention
    with exact_mode(model, "attention+linear"):
        spy_target = mlx_base.quantized_scaled_dot_product_attention

        def spy(q, *args, **kwargs):
            calls.append(q.shape[-2])
            return spy_target(q, *args, **kwargs)

        mlx_base.quantized_scaled_dot_product_attention = spy
        try:
            out = np.array(model(tokens, cache=cache)[0])
        finally:
            mlx_base.quantized_scaled_dot_product_attention = spy_target
    assert mlx_base.quantized_scaled_dot_product_attention is original
    assert calls == [5, 5] and np.array_equal(out, reference)


def test_engine_exact_mode_matches_plain_greedy_on_emulated_gpu(monkeypatch):
    from conftest import ScriptedDrafter

    from specbench import DraftPolicy, GenerateOptions, speculative_generate

    model = build_tiny("qwen3")
    prompt = [5, 17, 42, 8, 61, 3, 29, 77, 12, 50]
    # Differences large enough to flip greedy choices of the batched forward. The prompt's
    # prefill is batched in both runs; each decode step is a single row.
    emulate_gpu(monkeypatch, attention=True, linear_rows=1, size=0.3)
    truth = plain_greedy(model, prompt, 40)

    def run(verify):
        drafter = ScriptedDrafter(truth, len(prompt), 97, wrong_at=lambda step, i: (step + i) % 3 == 2)
        options = GenerateOptions(max_tokens=40, verify=verify, ignore_eos=True)
        generation = speculative_generate(model, prompt, options, drafter=drafter, policy=DraftPolicy.fixed(5))
        tokens = list(generation)
        return tokens, generation.log

    tokens, log = run("fast")
    assert tokens != truth
    tokens, log = run("exact")
    assert tokens == truth
    assert sum(r.accepted for r in log.records if r.kind == "verify") > 10  # drafts partly accepted
    assert sorted(load_calibration(model).widths)  # calibrated the widths it verified


# -- levels and the op probe -----------------------------------------------------------------


def test_level_names_parse_and_round_trip():
    assert ExactPlan.parse("all") == ExactPlan(attention=True, linear=1, experts=1)
    assert ExactPlan.parse("all").name == "attention+linear+experts"
    assert ExactPlan.parse("none") == ExactPlan()
    assert ExactPlan.parse("serial").serial
    for level in ("attention", "attention+linear/4", "linear/vector+experts/unsorted", "attention+experts/3"):
        assert ExactPlan.parse(level).name == level
    for bad in ("attn", "linear/0", "linear/x", "experts/vector", "attention/2"):
        with pytest.raises(ValueError, match="exact level"):
            ExactPlan.parse(bad)


@pytest.mark.skipif(mx.default_device().type == mx.DeviceType.gpu, reason="the CPU's ops")
def test_op_probe_on_cpu_finds_every_op_but_the_blas_ones_row_invariant():
    """On the CPU every op but those that call the BLAS (matmul, attention) is row-invariant; on MLX's reference
    BLAS those are too (an optimized BLAS such as OpenBLAS picks other kernels from a few rows on)."""
    rows = probe_ops(mx.float32, widths=(2, 5), dim=128)
    assert {r["op"] for r in rows} >= {"rms_norm", "rope", "router_topk", "expert_sum", "logsumexp", "attention"}
    blas_ops = ("matmul", "attention")
    assert all(r["row_invariant"] for r in rows if r["op"] not in blas_ops), rows
    if is_reference(blas_in_use()):
        assert all(r["row_invariant"] for r in rows), [r for r in rows if not r["row_invariant"]]


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"dim": 0}, "dim must be a positive multiple of 64"),
        ({"dim": 96}, "dim must be a positive multiple of 64"),
        ({"dim": -64}, "dim must be a positive multiple of 64"),
        ({"widths": ()}, "widths must be a non-empty list of integers >= 1"),
        ({"widths": (2, 0)}, "widths must be a non-empty list of integers >= 1"),
        ({"dtype": mx.int32}, "dtype must be a floating type"),
    ],
)
def test_op_probe_refuses_sizes_it_cannot_run(kwargs, named):
    """A zero or odd hidden size (a division by zero inside MLX: SIGFPE) or no widths: a ValueError first."""
    with pytest.raises(ValueError, match=named):
        probe_ops(**kwargs)


def test_calibrate_keeps_calibrated_widths_unless_forced(monkeypatch):
    model = build_tiny("llama")
    first = calibrate(model, [2, 3], measure=False)
    emulate_gpu(monkeypatch, attention=True, linear_rows=1)
    assert calibrate(model, [2, 3, 4], measure=False).level_for(2) == first.level_for(2)  # kept
    forced = calibrate(model, [2], measure=False, force=True).widths[2]
    assert forced.level != "none" and {"level": "none", "exact": False, "seconds": None} in forced.tests


def test_hybrid_model_with_recurrent_cache(monkeypatch):
    """Qwen3.5 (Gated DeltaNet layers keep an ArraysCache): calibration restores that state."""
    from specbench.models import synthetic

    model = synthetic.build("qwen3.5-9b-tiny")
    rng = np.random.default_rng(0)
    cache = make_prompt_cache(model)
    model(mx.array(rng.integers(0, 512, PREFIX))[None], cache=cache)
    saved = [None if c.is_trimmable() else exact_calibration._copy_state(c.state) for c in cache]

    def restore(n):
        for c, state in zip(cache, saved):
            if state is None:
                c.trim(n)
            else:
                c.state = exact_calibration._copy_state(state)

    tokens = mx.array(rng.integers(0, 512, 5))[None]
    reference = np.stack([np.array(model(tokens[:, i : i + 1], cache=cache)[0, 0]) for i in range(5)])
    restore(5)
    emulate_gpu(monkeypatch, attention=True, linear_rows=1)
    calibration = calibrate(model, [5], measure=False)
    for level in ("all", "serial", calibration.level_for(5)):
        with exact_mode(model, level):
            out = np.array(model(tokens, cache=cache)[0])
        restore(5)
        assert np.array_equal(out, reference), level
    with exact_mode(model, "none"):
        assert not np.array_equal(np.array(model(tokens, cache=cache)[0]), reference)


# -- emulating a layout-dependent attention kernel (cuDNN decoding on CUDA) ---------------------


def emulate_decoding_kernel(monkeypatch, bump):
    """Single-query attention over >= 256 keys gets ``bump(view)`` added (``view``: the keys as a
    numpy view whose strides reveal their KV buffer, as MLX reads them), as a layout-sensitive
    decoding kernel (cuDNN's on CUDA) rounds otherwise; exact mode is told attention is
    layout-sensitive."""
    patch_exact(monkeypatch, "layout_sensitive_attention", lambda: True)
    sdpa = mx.fast.scaled_dot_product_attention

    def variant(q, k, v, *args, **kwargs):
        out = sdpa(q, k, v, *args, **kwargs)
        if q.shape[-2] == 1 and k.shape[-2] >= 256:
            amount = bump(np.asarray(memoryview(k)))
            if amount:
                return out + mx.array(amount, dtype=out.dtype)
        return out

    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", variant)


def buffer_rows(view: np.ndarray) -> int:
    """The length of the KV buffer the keys ``view`` is a slice of."""
    return view.strides[1] // view.strides[2]


def emulate_cudnn_decoding(monkeypatch, size: float = 1e-3, by_extent: bool = True):
    """Keys that are a slice of a buffer whose length is a multiple of 256 run another kernel
    (here: the result is bumped, by an amount that grows with the buffer length when
    ``by_extent``), as MLX's CUDA backend sends those to cuDNN."""

    def bump(view):
        extent = buffer_rows(view)
        return size * (extent / 256 if by_extent else 1.0) if extent % 256 == 0 else 0.0

    emulate_decoding_kernel(monkeypatch, bump)


def relaid(cache, extent: int):
    """The same cache contents in KV buffers of ``extent`` rows (as a crossing verify leaves them)."""
    for c in cache:
        c.keys = with_extent(c.keys, c.offset, extent)
        c.values = with_extent(c.values, c.offset, extent)
    mx.eval([c.state for c in cache])


def serial_cache(model, tokens: list[int]):
    cache = make_prompt_cache(model)
    model(mx.array(tokens)[None], cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def test_serial_kv_layout_grows_and_shrinks_buffers_as_serial_decoding_does():
    model = build_tiny("qwen3")
    cache = serial_cache(model, list(range(50)) * 5)  # 250 tokens: a 256-row buffer
    assert serial_kv_layout(cache, 6) == 256 and cache[0].keys.shape[2] == 256
    relaid(cache, 250 + 256)  # what mlx-lm's growth leaves after a verify that crossed 256
    keys = np.array(cache[0].keys[..., :250, :])
    assert serial_kv_layout(cache, 8) == 512
    assert all(c.keys.shape[2] == 512 and c.values.shape[2] == 512 for c in cache)
    assert np.array_equal(np.array(cache[0].keys[..., :250, :]), keys)
    assert serial_kv_layout(cache, 1) == 256  # back below the step, as after a rollback
    assert serial_kv_layout([], 3) is None


def layout_case(monkeypatch, emulate_decoding, seed: int, prefix_len: int, width: int):
    """A tiny model on an emulated GPU (row-dependent linear and attention kernels, decoding attention
    from ``emulate_decoding``), a random prefix, ``width`` random tokens after it, and the logits
    serial steps give those tokens: (model, prefix, tokens, reference)."""
    model = build_tiny("qwen3")
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 97, prefix_len).tolist()
    tokens = mx.array(rng.integers(0, 97, width))[None]
    emulate_gpu(monkeypatch, attention=True, linear_rows=1)
    emulate_decoding(monkeypatch)
    return model, prefix, tokens, serial_logits(model, serial_cache(model, prefix), tokens)


def test_exact_verify_across_the_kv_buffer_step_matches_serial_on_layout_dependent_kernel(monkeypatch):
    # Rows attend 251..262 keys: the verification crosses the KV buffer's 256-row step.
    model, prefix, tokens, reference = layout_case(monkeypatch, emulate_cudnn_decoding, 4, 250, 12)
    crossed = serial_cache(model, prefix)
    relaid(crossed, 248 + 256)
    saved = [(c.keys, c.values) for c in crossed]

    def reset():
        for c, (k, v) in zip(crossed, saved):
            c.keys, c.values, c.offset = k, v, 250

    # Serial steps in the layout a speculative verify leaves differ (the emulated kernel has teeth) ...
    assert not np.array_equal(serial_logits(model, crossed, tokens), reference)
    for level in ("attention+linear", "serial", "attention+linear/vector"):
        reset()
        # ... while exact mode gives every row the layout serial decoding gives it.
        assert np.array_equal(verify_logits(model, crossed, tokens, level), reference), level
    # Rows before the step (251..256 keys) need the serial buffer length even in a 512-row buffer.
    reset()
    monkeypatch.setattr(exact_hooks, "_serial_kv_row", lambda k, v, n: (k[..., :n, :], v[..., :n, :]))
    assert not np.array_equal(verify_logits(model, crossed, tokens, "attention+linear"), reference)


def test_calibration_probes_the_kv_buffer_step(monkeypatch):
    # Without the serial layout, split attention is exact at short offsets but not across the step.
    patch_exact(monkeypatch, "serial_kv_layout", lambda cache, width=1: None)
    emulate_gpu(monkeypatch, attention=True, linear_rows=1)
    emulate_cudnn_decoding(monkeypatch, by_extent=False)
    model = build_tiny("qwen3")
    short = calibrate(model, [4], lengths=[32], measure=False, boundary=False, save=False)
    assert short.level_for(4) == "attention+linear/vector"
    exact_calibration._calibrations.clear()
    calibration = calibrate(model, [4], measure=False, save=False)
    assert calibration.level_for(4) == "serial"
    assert not any(r["exact"] for r in calibration.rows() if r["level"] != "serial")


def test_engine_exact_mode_across_the_kv_buffer_step_on_emulated_cuda(monkeypatch):
    from conftest import ScriptedDrafter

    from specbench import DraftPolicy, GenerateOptions, speculative_generate

    model = build_tiny("qwen3")
    prompt = np.random.default_rng(2).integers(0, 97, 236).tolist()
    emulate_gpu(monkeypatch, attention=True, linear_rows=1, size=0.3)
    emulate_cudnn_decoding(monkeypatch, size=0.3)
    truth = plain_greedy(model, prompt, 40)  # crosses 256 keys at token 20

    def run():
        drafter = ScriptedDrafter(truth, len(prompt), 97, wrong_at=lambda step, i: (step + i) % 3 == 2)
        options = GenerateOptions(max_tokens=40, verify="exact", ignore_eos=True)
        return list(speculative_generate(model, prompt, options, drafter=drafter, policy=DraftPolicy.fixed(7)))

    # Levels by the probe's order, not by timing: a measured pick of "serial" under load would never batch a row.
    calibrate(model, 8, measure=False)
    assert run() == truth
    patch_exact(monkeypatch, "serial_kv_layout", lambda cache, width=1: None)
    exact_calibration._calibrations.clear()
    assert run() != truth


# -- emulating a decoding kernel that reads past the keys it attends (cuDNN on CUDA) ------------


def emulate_tail_reading_decoding(monkeypatch, size: float = 0.3):
    """A result that depends on the buffer rows after the keys attended (as cuDNN's decoding
    attention on an H200 does): bumped when those rows, up to the buffer's length, are not all zero."""

    def bump(view):
        whole = np.lib.stride_tricks.as_strided(view, shape=(*view.shape[:2], buffer_rows(view), view.shape[3]))
        return size if np.any(whole[:, :, view.shape[2] :, :]) else 0.0

    emulate_decoding_kernel(monkeypatch, bump)


def test_exact_verify_rows_do_not_see_later_rows_on_a_tail_reading_kernel(monkeypatch):
    model, prefix, tokens, reference = layout_case(monkeypatch, emulate_tail_reading_decoding, 5, 260, 6)
    for level in ("attention+linear", "attention+linear/vector"):
        assert np.array_equal(verify_logits(model, serial_cache(model, prefix), tokens, level), reference), level
    # Rows attending their keys inside the verification's buffer see the later rows' keys.
    serial = exact_hooks._serial_kv_row

    def in_place(k, v, n):
        return (k[..., :n, :], v[..., :n, :]) if n < k.shape[-2] else serial(k, v, n)

    monkeypatch.setattr(exact_hooks, "_serial_kv_row", in_place)
    assert not np.array_equal(verify_logits(model, serial_cache(model, prefix), tokens, "attention+linear"), reference)


def test_engine_exact_mode_clears_rejected_rows_on_a_tail_reading_kernel(monkeypatch):
    from conftest import ScriptedDrafter

    from specbench import DraftPolicy, GenerateOptions, speculative_generate
    from specbench.core.draft import Draft

    model = build_tiny("qwen3")
    prompt = np.random.default_rng(6).integers(0, 97, 250).tolist()
    emulate_gpu(monkeypatch, attention=True, linear_rows=1, size=0.3)
    emulate_tail_reading_decoding(monkeypatch)
    truth = plain_greedy(model, prompt, 30)

    class Varying(ScriptedDrafter):
        """Drafts of 4 and of none in turn: a plain step follows each verification."""

        def draft(self, context, k):
            draft = super().draft(context, k)
            return Draft(draft.tokens if self.calls % 2 else [])

    def run():
        drafter = Varying(truth, len(prompt), 97, wrong_at=lambda step, i: i == 1)
        options = GenerateOptions(max_tokens=30, verify="exact", ignore_eos=True)
        return list(speculative_generate(model, prompt, options, drafter=drafter, policy=DraftPolicy.fixed(4)))

    assert run() == truth
    # Rejected rows left in the buffer change the next steps' attention.
    patch_exact(monkeypatch, "clear_rejected", lambda cache, count: None)
    assert run() != truth


def test_cudnn_attention_keys_calibrations_and_warns_once(monkeypatch):
    model = build_tiny("qwen3")
    assert not cudnn_attention()  # the CPU
    plain_key = calibration_key(model)
    exact_calibration._keys.clear()
    patch_exact(monkeypatch, "cudnn_attention", lambda: True)
    monkeypatch.setattr(exact_hooks, "_warned_cudnn", False)
    assert calibration_key(model) != plain_key  # calibrated apart from cuDNN-off runs
    with pytest.warns(UserWarning, match="MLX_CUDA_USE_CUDNN_SDPA=0"):
        with exact_mode(model, "none"):
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with exact_mode(model, "none"):  # once per process
            pass
    exact_calibration._keys.clear()


def test_importing_specbench_turns_cudnn_attention_off_unless_set():
    """MLX's CUDA backend reads the variable when it first runs attention: specbench sets "0"
    (MLX's own kernels, bit-identical across KV layouts) and keeps what the user chose."""
    import subprocess
    import sys

    probe = "import os, specbench; print(os.environ.get('MLX_CUDA_USE_CUDNN_SDPA'))"
    env = {k: v for k, v in os.environ.items() if k != CUDNN_ATTENTION_ENV}
    unset = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    chosen = subprocess.run(
        [sys.executable, "-c", probe], env={**env, CUDNN_ATTENTION_ENV: "1"}, capture_output=True, text=True, check=True
    )
    assert (unset.stdout.strip(), chosen.stdout.strip()) == ("0", "1")


def test_calibration_key_follows_the_blas_library_and_the_method(monkeypatch):
    from specbench.common import identity

    model = build_tiny("llama")
    exact_calibration._keys.clear()
    key = calibration_key(model)
    assert exact_calibration.CALIBRATION_METHOD >= 4  # tables keyed without the BLAS library are not reused
    exact_calibration._keys.clear()
    monkeypatch.setattr(identity, "blas_in_use", lambda: "OtherBLAS 9.9, 3 threads")
    monkeypatch.setattr(identity.mx, "default_device", lambda: mx.Device(mx.cpu))
    other = calibration_key(model)
    exact_calibration._keys.clear()
    assert other != key and other.split("-")[:-1] == key.split("-")[:-1]  # same model shape, other kernels


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"key": "k"}', '{"key": "k", "device": "d", "widths": 5}'])
def test_damaged_calibration_is_moved_aside_and_made_anew(tmp_path, text):
    model = build_tiny("llama")
    path = tmp_path / "exact" / f"{calibration_key(model)}.json"
    path.parent.mkdir()
    path.write_text(text)
    with pytest.warns(UserWarning, match=f"calibration {path} is damaged .*moved aside"):
        assert load_calibration(model) is None
    assert [p.name.split(".damaged-")[0] for p in path.parent.glob("*.damaged-*")] == [path.name]
    calibrate(model, [2], measure=False)
    assert sorted(load_calibration(model).widths) == [2] and Calibration.from_json(json.loads(path.read_text()))
