"""What the exact verifier's bit-identity rests on, probed at the kernel: single-query attention over keys held in
KV buffers of different lengths (the serial layout, the one a crossing verify leaves, a fresh one), repeated calls,
the two spellings of a greedy log-softmax; split attention rows of a verify at a 256-key crossing against serial
steps, call by call; and serial steps on copies of a prefilled cache. Used by scripts/gpu/exact_diagnose.py.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import KVCache, make_prompt_cache

from specbench.core.forward import vocab_size
from specbench.exact import exact_mode
from specbench.exact.layout import serial_extent, with_extent

#: mlx-lm's KV buffer step (rows added at a time).
STEP = KVCache.step


def bits(a: mx.array) -> np.ndarray:
    """The array as float32 numpy (bit-exact for float16, bfloat16 and float32)."""
    return np.array(a.astype(mx.float32))


def same(a: mx.array | np.ndarray, b: mx.array | np.ndarray) -> bool:
    """Whether two arrays are bit-identical."""
    return bool(np.array_equal(bits(a) if isinstance(a, mx.array) else a, bits(b) if isinstance(b, mx.array) else b))


class Snapshot:
    """A cache's contents kept in separate arrays, rebuilt in a chosen KV buffer length."""

    def __init__(self, cache: list[Any]):
        self.offset = cache[0].offset
        self.extent = cache[0].keys.shape[2]
        self.kv = [
            (mx.contiguous(c.keys[..., : c.offset, :]), mx.contiguous(c.values[..., : c.offset, :])) for c in cache
        ]
        mx.eval(self.kv)

    def cache(self, extent: int | None = None) -> list[KVCache]:
        """A fresh cache of these contents in a buffer of ``extent`` rows (the original length by default)."""
        cache = []
        for k, v in self.kv:
            c = KVCache()
            c.keys = with_extent(k, self.offset, extent or self.extent)
            c.values = with_extent(v, self.offset, extent or self.extent)
            c.offset = self.offset
            cache.append(c)
        mx.eval([c.state for c in cache])
        return cache


def kernel_checks(quick: bool) -> dict[str, Any]:
    """Single-query attention over n keys held in buffers of different lengths (serial, verify-grown, one step
    larger, fresh; the query contiguous or a row of a wider tensor), distinct outputs of repeated calls, and
    mlx-lm's greedy log-softmax (all axes) against the engine's (last axis). ``quick``: small float32 shapes."""
    dtype = mx.float32 if quick else mx.bfloat16
    heads, kv_heads, dim = (4, 2, 64) if quick else (32, 8, 128)
    mx.random.seed(0)
    big = 1024
    keys = mx.random.normal((1, kv_heads, big, dim)).astype(dtype)
    values = mx.random.normal((1, kv_heads, big, dim)).astype(dtype)
    q_wide = mx.random.normal((1, heads, 4, dim)).astype(dtype)
    q = mx.contiguous(q_wide[..., 1:2, :])
    mx.eval(keys, values, q_wide, q)
    scale = dim**-0.5

    def attend(query: mx.array, n: int, extent: int) -> mx.array:
        k = with_extent(keys, n, extent)[..., :n, :]
        v = with_extent(values, n, extent)[..., :n, :]
        mx.eval(k, v)
        out = mx.fast.scaled_dot_product_attention(query, k, v, scale=scale)
        mx.eval(out)
        return out

    rows = []
    for n in (200, 255, 256, 257, 300, 511, 512, 513):
        ref = attend(q, n, serial_extent(n))
        row = {"keys": n, "serial_T": serial_extent(n)}
        for label, extent in (("T=n+250", n + 250), ("T=serial+256", serial_extent(n) + STEP), ("fresh T=n", n)):
            row[label] = "same" if same(attend(q, n, extent), ref) else "DIFF"
        row["q row of wider"] = "same" if same(attend(q_wide[..., 1:2, :], n, serial_extent(n)), ref) else "DIFF"
        rows.append(row)
    repeat = {}
    for label, n, extent in (("300 in 512 (serial)", 300, 512), ("300 in 550 (verify-grown)", 300, 550)):
        outs = {bits(attend(q, n, extent)).tobytes() for _ in range(40 if quick else 300)}
        repeat[label] = len(outs)
    # mlx-lm's greedy: logits - logsumexp(logits) over all axes of [1, V]; the engine: over axis -1.
    vocab = 4096 if quick else 151936
    lse_diff = argmax_diff = 0
    trials = 20 if quick else 200
    for _ in range(trials):
        x = (mx.random.normal((1, vocab)) * 3).astype(dtype)
        a = x - mx.logsumexp(x, keepdims=True)
        b = x - mx.logsumexp(x, axis=-1, keepdims=True)
        lse_diff += not same(a, b)
        argmax_diff += int(mx.argmax(a, axis=-1).item() != mx.argmax(b, axis=-1).item())
    return {
        "layout": rows,
        "distinct_outputs_of_repeated_calls": repeat,
        "greedy_lse": {"rows": trials, "logprobs_differ": lse_diff, "argmax_differs": argmax_diff},
        "cudnn_off": cudnn_off_check(),
    }


CUDNN_OFF_CHECK = """
import mlx.core as mx, numpy as np
mx.random.seed(0)
k = mx.random.normal((1, 8, 1024, 128)).astype(mx.bfloat16); v = mx.random.normal((1, 8, 1024, 128)).astype(mx.bfloat16)
q = mx.random.normal((1, 32, 1, 128)).astype(mx.bfloat16)
def attend(n, extent):
    kk = mx.contiguous(k[..., :extent, :])[..., :n, :]; vv = mx.contiguous(v[..., :extent, :])[..., :n, :]
    mx.eval(kk, vv)
    return np.array(mx.fast.scaled_dot_product_attention(q, kk, vv, scale=128 ** -0.5).astype(mx.float32))
print("same" if np.array_equal(attend(300, 512), attend(300, 550)) else "DIFF")
"""


def cudnn_off_check() -> str:
    """With MLX_CUDA_USE_CUDNN_SDPA=0 (in a fresh process): does the buffer layout still matter?"""
    env = {**os.environ, "MLX_CUDA_USE_CUDNN_SDPA": "0"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", CUDNN_OFF_CHECK], env=env, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return "timed out"
    return done.stdout.strip() or f"failed: {done.stderr.strip()[-200:]}"


@contextlib.contextmanager
def attention_spy(calls: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    """Record every attention call's inputs and output (bits) while open."""
    original = mx.fast.scaled_dot_product_attention

    def spy(q, k, v, *args, **kwargs):
        out = original(q, k, v, *args, **kwargs)
        mx.eval(out)
        calls.append(
            {
                "q": bits(q),
                "k": bits(k),
                "v": bits(v),
                "out": bits(out),
                "keys": k.shape[-2],
                "dtype": q.dtype,
                "scale": kwargs.get("scale"),
            }
        )
        return out

    mx.fast.scaled_dot_product_attention = spy
    try:
        yield calls
    finally:
        mx.fast.scaled_dot_product_attention = original


def crossing_calls(model: nn.Module, width: int, offset: int, level: str) -> dict[str, Any]:
    """Split attention rows of a width-w verify at ``offset`` against serial steps, call by call.

    For each layer and row: are the query, keys and values bit-identical to the serial step's,
    and the output? Where the inputs are identical and the output is not, the kernel is
    recomputed on fresh arrays holding each side's inputs in the serial layout: if those agree
    with each other, the result depended on more than the values (memory, history).
    """
    rng = np.random.default_rng(3)
    vocab = vocab_size(model)
    context = rng.integers(0, vocab, size=offset).tolist()
    tokens = rng.integers(0, vocab, size=width).tolist()
    snap = Snapshot(_prefill(model, context))
    serial: list = []
    with attention_spy(serial):
        cache = snap.cache(serial_extent(offset))
        for t in tokens:
            mx.eval(model(mx.array([[t]], dtype=mx.uint32), cache=cache))
    split: list = []
    with attention_spy(split):
        cache = snap.cache(serial_extent(offset))
        with exact_mode(model, level):
            mx.eval(model(mx.array([tokens], dtype=mx.uint32), cache=cache))
    layers = len(serial) // width
    # serial calls are step-major (step 0: every layer, ...); split calls layer-major (layer 0: every row)
    rows = []
    for layer in range(layers):
        for r in range(width):
            a, b = serial[r * layers + layer], split[layer * width + r]
            row = {
                "layer": layer,
                "row": r,
                "keys": a["keys"],
                "keys_split": b["keys"],
                **{x: bool(np.array_equal(a[x], b[x])) for x in ("q", "k", "v", "out")},
            }
            if row["q"] and row["k"] and row["v"] and not row["out"]:
                fresh = _fresh_out(a)
                row["fresh_equals_serial"] = bool(np.array_equal(fresh, a["out"]))
                row["fresh_equals_split"] = bool(np.array_equal(fresh, b["out"]))
            rows.append(row)
    return {
        "width": width,
        "offset": offset,
        "level": level,
        "calls": rows,
        "first_mismatch": next((r for r in rows if not all(r[x] for x in ("q", "k", "v", "out"))), None),
    }


def copied_cache_steps(model: nn.Module, offset: int, steps: int) -> dict[str, Any]:
    """Serial steps on the cache a prefill built against the same steps on a copy of it (same
    contents, same buffer length, fresh arrays), and on a copy whose rows past the offset were
    zeroed by a slice update as the engine's rollback does: do equal caches give equal logits?"""
    rng = np.random.default_rng(5)
    vocab = vocab_size(model)
    context = rng.integers(0, vocab, size=offset).tolist()
    tokens = [[t] for t in rng.integers(0, vocab, size=steps).tolist()]
    built = _prefill(model, context)
    snap = Snapshot(built)

    def run(cache: list[Any]) -> np.ndarray:
        return np.stack([bits(model(mx.array([t], dtype=mx.uint32), cache=cache)[0, 0]) for t in tokens])

    copy = snap.cache()
    zeroed = snap.cache()
    for c in zeroed:
        c.keys[..., c.offset : c.offset + 4, :] = 0
        c.values[..., c.offset : c.offset + 4, :] = 0
    reference = run(built)
    first = run(snap.cache())
    result = {
        "offset": offset,
        "steps": steps,
        "copy_equal": bool(np.array_equal(run(copy), reference)),
        "slice_zeroed_equal": bool(np.array_equal(run(zeroed), reference)),
        "rerun_equal": bool(np.array_equal(run(snap.cache()), first)),
    }
    # History: the same steps after attention calls at many other key counts and buffer lengths.
    c0 = snap.cache()[0]
    q = mx.zeros((1, c0.keys.shape[1] * 4, 1, c0.keys.shape[-1]), dtype=c0.keys.dtype)
    for n in range(offset - 40, offset + 1, 3):
        for extent in (serial_extent(n), n + 7):
            k = with_extent(c0.keys, n, extent)[..., :n, :]
            mx.eval(mx.fast.scaled_dot_product_attention(q, k, k, scale=0.1))
    result["after_other_calls_equal"] = bool(np.array_equal(run(snap.cache()), first))
    return result


def _fresh_out(call: dict[str, Any]) -> np.ndarray:
    """The recorded call recomputed on fresh arrays, the keys in a zero-tailed serial buffer."""
    n, dtype = call["keys"], call["dtype"]
    q = mx.array(call["q"]).astype(dtype)
    k = with_extent(mx.array(call["k"]).astype(dtype), n, serial_extent(n))[..., :n, :]
    v = with_extent(mx.array(call["v"]).astype(dtype), n, serial_extent(n))[..., :n, :]
    return bits(mx.fast.scaled_dot_product_attention(q, k, v, scale=call["scale"]))


def _prefill(model: nn.Module, context: list[int]) -> list[Any]:
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([context], dtype=mx.uint32), cache=cache))
    return cache
