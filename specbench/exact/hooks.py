"""Exact verification: a width-w forward whose every row is computed as serial decoding computes it.

On a GPU a forward over w tokens is not bit-identical to w single-token steps: matrix products
over w rows and attention over w queries run other kernels (other reduction orders) than the
1-row products and the single-query attention of a decode step. Inside ``exact_mode(model)``
the layers that differ are run row by row through the very calls a decode step makes:

- ``attention``: row i runs as one query over the cache prefix it sees in serial decoding
  (keys ``[:offset + i + 1]``, no mask), through ``mx.fast.scaled_dot_product_attention`` (or
  mlx-lm's quantized-cache attention);
- ``linear``: ``nn.Linear``, ``nn.QuantizedLinear``, ``nn.QQLinear`` and tied output
  embeddings (``as_linear``) take 1 row per call (``linear/c``: c rows per call, exact where the
  device's kernel for up to c rows is row-invariant; ``linear/vector``: one batched call of
  w single-row products, for kernels that run each batch entry as a matrix-vector product);
- ``experts``: MoE expert products (``SwitchGLU``, ``SwitchMLP``) take 1 token per call
  (``experts/unsorted``: as many tokens per call as mlx-lm routes without sorting them, which
  keeps its per-token gather kernels);
- ``serial``: w single-token forwards (exact by construction, for models with other
  row-dependent layers).

Every other op of the mlx-lm models (embedding, RMSNorm, RoPE at an offset, elementwise ops,
softmax and top-k routing, residual sums) computes each row on its own: ``probe_ops`` checks
that on the current device.

A kernel can also depend on the memory layout of the KV cache. On MLX's CUDA backend (cuDNN's
decoding attention) a single query over n >= 256 keys that are a slice of a cache buffer gives
a result that depends on the buffer's length and on the rows after the n it attends (measured
on an H200: scripts/gpu/exact_diagnose.py). Serial decoding grows the buffer in whole steps of
256 rows and has written nothing past the current token; a verification that crosses a step
grows it to ``offset + 256``, writes w rows at once, and a rollback leaves rejected rows behind.
Inside ``exact_mode`` the caches therefore get the buffer serial decoding would have
(``serial_kv_layout``), each split attention row but the last attends to a copy of its keys in
a buffer of its serial length with zeros after them, and the engine zeros rejected rows
(``clear_rejected``). Which split is needed depends on dtype, width and device, so
``calibrate`` tests the levels against serial steps on the device and keeps, per width, the
cheapest that is bit-identical; ``exact_mode(model)`` uses that table (calibrating a width the
first time it is asked for) and caches it under ``$SPECBENCH_HOME/exact``.

The split is installed by swapping the ``__call__`` of those classes (and the attention
function) while the context is open: no model file is copied, and every mlx-lm model that
builds on these layers is covered.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import statistics
import tempfile
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import base as mlx_base
from mlx_lm.models import switch_layers
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

# -- levels ----------------------------------------------------------------------------------

#: Named levels, from no splitting to serial steps.
LEVELS = ("none", "attention", "attention+linear", "all", "serial")
_ALIASES = {"all": "attention+linear+experts", "": "none"}
#: mlx-lm sorts the tokens routed to experts when ``indices.size >= 64`` (switch_layers.py).
_MLX_LM_SORT_THRESHOLD = 64


@dataclass(frozen=True)
class ExactPlan:
    """Which layers a verify forward runs row by row, and how many rows per call.

    ``linear`` / ``experts``: None (one batched call), an int (rows per call; 1 = row by row),
    or "vector" / "unsorted" (see the module docstring).
    """

    attention: bool = False
    linear: int | str | None = None
    experts: int | str | None = None
    serial: bool = False

    @classmethod
    def parse(cls, level: "str | ExactPlan") -> "ExactPlan":
        """Parse a level such as ``"attention+linear/4+experts/unsorted"``, ``"all"``, ``"serial"``."""
        if isinstance(level, ExactPlan):
            return level
        if not isinstance(level, str):
            raise ValueError(f"an exact level is a string such as 'attention+linear', got {level!r}")
        text = _ALIASES.get(level.strip(), level.strip())
        if text == "none":
            return cls()
        if text == "serial":
            return cls(attention=True, linear=1, experts=1, serial=True)
        parts: dict[str, Any] = {}
        for part in text.split("+"):
            name, _, arg = part.partition("/")
            if name == "attention" and not arg:
                parts["attention"] = True
            elif name in ("linear", "experts"):
                special = "vector" if name == "linear" else "unsorted"
                if not arg:
                    parts[name] = 1
                elif arg == special:
                    parts[name] = special
                elif arg.isdigit() and int(arg) >= 1:
                    parts[name] = int(arg)
                else:
                    raise ValueError(f"bad rows per call {arg!r} in exact level {level!r}: use an integer >= 1 or {special!r}")
            else:
                raise ValueError(
                    f"unknown part {part!r} in exact level {level!r}: levels join 'attention', 'linear[/c|/vector]' "
                    f"and 'experts[/c|/unsorted]' with '+', or are one of {LEVELS}"
                )
        return cls(**parts)

    @property
    def name(self) -> str:
        if self.serial:
            return "serial"
        parts = ["attention"] if self.attention else []
        for key in ("linear", "experts"):
            value = getattr(self, key)
            if value is not None:
                parts.append(key if value == 1 else f"{key}/{value}")
        return "+".join(parts) or "none"

    def __str__(self) -> str:
        return self.name


@functools.lru_cache(maxsize=256)
def _parse_name(level: str) -> ExactPlan:
    return ExactPlan.parse(level)


def _parse(level: "str | ExactPlan") -> ExactPlan:
    return level if isinstance(level, ExactPlan) else _parse_name(level)


# -- the split calls -------------------------------------------------------------------------


class _Context:
    """One open ``exact_mode``: its models, how it picks a plan for a width, and the length of the
    KV buffers of the forward that runs (None when unknown or not uniform)."""

    def __init__(self, models: set[int], resolve: Callable[[int], ExactPlan]):
        self.models = models
        self.resolve = resolve
        self.plan: ExactPlan | None = None
        self.kv_extent: int | None = None
        self.layout_sensitive = layout_sensitive_attention()

    def plan_for(self, rows: int) -> ExactPlan | None:
        if rows <= 1:
            return None
        return self.plan if self.plan is not None else self.resolve(rows)


_contexts: list[_Context] = []


def _plan(rows: int) -> ExactPlan | None:
    return _contexts[-1].plan_for(rows) if _contexts else None


# -- the KV layout of serial decoding ------------------------------------------------------------


def _serial_extent(keys: int, step: int = KVCache.step) -> int:
    """The buffer length of an mlx-lm ``KVCache`` holding ``keys`` keys after serial decoding
    (and after a prefill): it grows in whole steps."""
    return step * ((keys + step - 1) // step)


def _with_extent(x: mx.array, n: int, extent: int) -> mx.array:
    """A fresh ``[..., extent, D]`` buffer holding ``x[..., :n, :]`` (zeros after)."""
    rows = x[..., :n, :]
    if extent == n:
        return mx.contiguous(rows)
    pad = mx.zeros((*x.shape[:-2], extent - n, x.shape[-1]), dtype=x.dtype)
    return mx.concatenate([rows, pad], axis=-2)


def serial_kv_layout(cache: Sequence[Any] | None, width: int = 1) -> int | None:
    """Give each mlx-lm ``KVCache`` in ``cache`` the buffer serial decoding has after ``width``
    more tokens: ``256 * ceil((offset + width) / 256)`` rows (a copy when it differs, which after
    the first call happens only when a forward crosses a buffer step or a rollback goes back
    across one). Returns that length when every attention cache is such a ``KVCache`` (then the
    split attention knows the layout of its keys), else None.

    A verification that crosses a step boundary otherwise grows the buffer to ``offset + 256``
    rows, and kernels that choose by the layout of the keys (cuDNN decoding attention on CUDA)
    then compute later steps differently than serial decoding does.
    """
    extents: set[int] = set()
    others = False
    for c in cache or ():
        if type(c) is not KVCache:
            others |= hasattr(c, "keys") and not isinstance(c, QuantizedKVCache)
            continue
        if c.keys is None:
            continue
        target = _serial_extent(c.offset + width, c.step)
        if c.keys.shape[2] != target:
            c.keys = _with_extent(c.keys, c.offset, target)
            c.values = _with_extent(c.values, c.offset, target)
        extents.add(target)
    return extents.pop() if len(extents) == 1 and not others else None


#: The environment variable with which MLX's CUDA backend turns cuDNN's attention off ("0").
CUDNN_ATTENTION_ENV = "MLX_CUDA_USE_CUDNN_SDPA"
# Importing specbench sets it to "0" unless it is set (specbench/__init__.py).


def cudnn_attention() -> bool:
    """Whether decoding attention may run through cuDNN: MLX's CUDA backend on the default
    device, with ``MLX_CUDA_USE_CUDNN_SDPA`` not set to "0" (MLX reads it when it first runs
    attention, so set it before that)."""
    cuda = getattr(mx, "cuda", None)
    return (
        mx.default_device().type == mx.DeviceType.gpu
        and cuda is not None
        and cuda.is_available()
        and os.environ.get(CUDNN_ATTENTION_ENV, "1") != "0"
    )


def layout_sensitive_attention() -> bool:
    """Whether a decoding attention's result depends on the KV buffer around the keys it
    attends (its length, the rows after them): cuDNN's, on CUDA. MLX's own kernels (Metal,
    CUDA with cuDNN off, CPU) read exactly the keys they attend."""
    return cudnn_attention()


def _serial_kv_row(keys: mx.array, values: mx.array, n: int) -> tuple[mx.array, mx.array]:
    """Keys and values ``[..., :n, :]`` laid out as a serial step attending ``n`` keys sees them.

    Where attention is layout-sensitive: in a buffer of the serial length whose rows after
    ``n`` are zeros (a serial step has not written them yet; cuDNN's decoding attention reads
    past the keys it attends, so the later rows of a verification would change the result).
    """
    ctx = _contexts[-1] if _contexts else None
    extent = ctx.kv_extent if ctx is not None else None
    serial = _serial_extent(n)
    if extent is None or (serial == extent and (n == keys.shape[-2] or not ctx.layout_sensitive)):
        return keys[..., :n, :], values[..., :n, :]
    return _with_extent(keys, n, serial)[..., :n, :], _with_extent(values, n, serial)[..., :n, :]


def clear_rejected(cache: Sequence[Any], count: int) -> None:
    """Zero the ``count`` rows after each ``KVCache``'s offset (just trimmed): the buffer then
    holds what serial decoding's holds, zeros past the current token."""
    for c in cache:
        if type(c) is KVCache and c.keys is not None and count > 0:
            start, stop = c.offset, min(c.offset + count, c.keys.shape[2])
            if stop > start:
                c.keys[..., start:stop, :] = 0
                c.values[..., start:stop, :] = 0


def _in_chunks(call: Callable[[mx.array], mx.array], x: mx.array, rows: int) -> mx.array:
    """``call`` over rows of ``x`` (all leading axes flattened), ``rows`` at a time, rejoined."""
    n = x.size // x.shape[-1]
    flat = x.reshape(1, n, x.shape[-1])
    parts = [call(flat[:, i : i + rows, :]) for i in range(0, n, rows)]
    out = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1)
    return out.reshape(*x.shape[:-1], *out.shape[2:])


def _vector_matmul(x: mx.array, weight: mx.array, bias: mx.array | None) -> mx.array:
    """``x @ weight.T (+ bias)`` as a batch of n single-row products.

    The rows are laid out with a batch stride other than K so that MLX cannot fold the batch
    back into one n-row product; the weight is broadcast (stride 0) along the batch.
    """
    n, k = x.size // x.shape[-1], x.shape[-1]
    flat = x.reshape(n, k)
    rows = mx.concatenate([flat, mx.zeros_like(flat)], axis=-1).reshape(n, 2, k)[:, :1, :]
    w = mx.broadcast_to(weight.T, (n, k, weight.shape[0]))
    out = mx.addmm(bias, rows, w) if bias is not None else rows @ w
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _linear_call(original: Callable, vector: Callable | None) -> Callable:
    def call(self, x: mx.array, *args, **kwargs) -> mx.array:
        plan = _plan(x.size // x.shape[-1]) if x.ndim >= 2 else None
        if plan is None or plan.linear is None:
            return original(self, x, *args, **kwargs)
        if plan.linear == "vector":
            if vector is not None:
                return vector(self, x)
            n = x.size // x.shape[-1]
            out = original(self, x.reshape(n, 1, x.shape[-1]), *args, **kwargs)
            return out.reshape(*x.shape[:-1], out.shape[-1])
        return _in_chunks(lambda part: original(self, part, *args, **kwargs), x, plan.linear)

    call.__wrapped__ = original
    return call


def _linear_vector(self: nn.Linear, x: mx.array) -> mx.array:
    return _vector_matmul(x, self["weight"], self["bias"] if "bias" in self else None)


def _embedding_vector(self: nn.Embedding, x: mx.array) -> mx.array:
    return _vector_matmul(x, self.weight, None)


def _experts_call(original: Callable) -> Callable:
    def call(self, x: mx.array, indices: mx.array, *args, **kwargs) -> mx.array:
        n = x.size // x.shape[-1]
        plan = _plan(n)
        if plan is None or plan.experts is None:
            return original(self, x, indices, *args, **kwargs)
        k = indices.shape[-1]
        rows = plan.experts
        if rows == "unsorted":
            rows = max(1, (_MLX_LM_SORT_THRESHOLD - 1) // k)
        flat_x = x.reshape(1, n, x.shape[-1])
        flat_i = indices.reshape(1, n, k)
        parts = [
            original(self, flat_x[:, i : i + rows], flat_i[:, i : i + rows], *args, **kwargs)
            for i in range(0, n, rows)
        ]
        out = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1)
        return out.reshape(*x.shape[:-1], *out.shape[2:])

    call.__wrapped__ = original
    return call


def _row_mask(mask: Any, i: int, n: int) -> Any:
    """The mask a serial step at row i would use: none for a causal mask, else row i's slice."""
    if mask is None or isinstance(mask, str):
        return None
    return mask[..., i : i + 1, :n]


def _attention_call(original: Callable) -> Callable:
    def sdpa(queries, keys, values, *args, scale: float, mask: Any = None, **kwargs):
        rows = queries.shape[-2]
        plan = _plan(rows)
        causal = isinstance(mask, str) and mask == "causal" or isinstance(mask, mx.array)
        if plan is None or not plan.attention or not causal:
            return original(queries, keys, values, *args, scale=scale, mask=mask, **kwargs)
        prefix = keys.shape[-2] - rows
        outs = []
        for i in range(rows):
            n = prefix + i + 1
            row_keys, row_values = _serial_kv_row(keys, values, n)
            outs.append(
                original(
                    mx.contiguous(queries[..., i : i + 1, :]), row_keys, row_values, *args,
                    scale=scale, mask=_row_mask(mask, i, n), **kwargs,
                )
            )
        return mx.concatenate(outs, axis=-2)

    sdpa.__wrapped__ = original
    return sdpa


def _quantized_attention_call(original: Callable) -> Callable:
    def qsdpa(queries, q_keys, q_values, scale, mask, group_size: int = 64, bits: int = 8):
        rows = queries.shape[-2]
        plan = _plan(rows)
        causal = isinstance(mask, str) and mask == "causal" or isinstance(mask, mx.array)
        if plan is None or not plan.attention or not causal:
            return original(queries, q_keys, q_values, scale, mask, group_size, bits)
        prefix = q_keys[0].shape[-2] - rows
        outs = []
        for i in range(rows):
            n = prefix + i + 1
            k = tuple(a[..., :n, :] for a in q_keys)
            v = tuple(a[..., :n, :] for a in q_values)
            outs.append(original(queries[..., i : i + 1, :], k, v, scale, _row_mask(mask, i, n), group_size, bits))
        return mx.concatenate(outs, axis=-2)

    qsdpa.__wrapped__ = original
    return qsdpa


def _model_call(original: Callable) -> Callable:
    """Top-level hook: picks the plan for the forward's width; runs serial plans step by step."""

    def call(self, inputs, *args, **kwargs):
        ctx = _contexts[-1] if _contexts else None
        if ctx is None or id(self) not in ctx.models:
            return original(self, inputs, *args, **kwargs)
        width = _width(inputs, kwargs)
        cache = kwargs.get("cache", args[0] if args and isinstance(args[0], (list, tuple)) else None)
        plan = ctx.resolve(width) if width > 1 else None
        if plan is None or not plan.serial:
            saved = ctx.kv_extent
            ctx.kv_extent = serial_kv_layout(cache, max(width, 1))
            ctx.plan = plan if plan is not None else ctx.plan
            try:
                return original(self, inputs, *args, **kwargs)
            finally:
                ctx.kv_extent = saved
        ctx.plan = plan
        outs = []
        for i in range(width):
            step_inputs = inputs[:, i : i + 1] if isinstance(inputs, mx.array) else inputs
            step_kwargs = {
                key: value[:, i : i + 1] if _is_row_array(value, width) else value for key, value in kwargs.items()
            }
            serial_kv_layout(cache, 1)
            outs.append(original(self, step_inputs, *args, **step_kwargs))
        if isinstance(outs[0], (tuple, list)):
            return type(outs[0])(mx.concatenate(list(parts), axis=1) for parts in zip(*outs))
        return mx.concatenate(outs, axis=1)

    call.__wrapped__ = original
    return call


def _is_row_array(value: Any, width: int) -> bool:
    return isinstance(value, mx.array) and value.ndim >= 2 and value.shape[1] == width


def _width(inputs: Any, kwargs: dict[str, Any]) -> int:
    if isinstance(inputs, mx.array) and inputs.ndim >= 2:
        return inputs.shape[1]
    embeddings = kwargs.get("input_embeddings")
    if isinstance(embeddings, mx.array) and embeddings.ndim >= 3:
        return embeddings.shape[1]
    return 1


def _op_patches() -> list[tuple[Any, str, Callable[[Callable], Callable]]]:
    """(owner, attribute, wrapper factory) for every op exact mode splits."""
    patches: list[tuple[Any, str, Callable[[Callable], Callable]]] = [
        (mx.fast, "scaled_dot_product_attention", _attention_call),
        (mlx_base, "quantized_scaled_dot_product_attention", _quantized_attention_call),
        (nn.Linear, "__call__", lambda f: _linear_call(f, _linear_vector)),
        (nn.QuantizedLinear, "__call__", lambda f: _linear_call(f, None)),
        (nn.Embedding, "as_linear", lambda f: _linear_call(f, _embedding_vector)),
        (nn.QuantizedEmbedding, "as_linear", lambda f: _linear_call(f, None)),
        (switch_layers.SwitchGLU, "__call__", _experts_call),
        (switch_layers.SwitchMLP, "__call__", _experts_call),
    ]
    if hasattr(nn, "QQLinear"):
        patches.append((nn.QQLinear, "__call__", lambda f: _linear_call(f, None)))
    return patches


_installed: dict[tuple[int, str], tuple[Any, Any, int]] = {}


def _install(owner: Any, attribute: str, factory: Callable[[Callable], Callable]) -> None:
    key = (id(owner), attribute)
    if key in _installed:
        saved_owner, original, count = _installed[key]
        _installed[key] = (saved_owner, original, count + 1)
        return
    original = owner.__dict__[attribute] if isinstance(owner, type) else getattr(owner, attribute)
    _installed[key] = (owner, original, 1)
    setattr(owner, attribute, factory(original))


def _uninstall(owner: Any, attribute: str) -> None:
    key = (id(owner), attribute)
    saved_owner, original, count = _installed[key]
    if count > 1:
        _installed[key] = (saved_owner, original, count - 1)
        return
    del _installed[key]
    setattr(owner, attribute, original)


def _hooked_modules(model: nn.Module) -> list[nn.Module]:
    """The model and the inner modules a forward may be entered through (``model.model``)."""
    found: list[nn.Module] = []
    lm = getattr(model, "language_model", model)
    for module in (model, lm, getattr(lm, "model", None)):
        if isinstance(module, nn.Module) and all(module is not m for m in found):
            found.append(module)
    return found


def _owner_of_call(cls: type) -> type:
    for klass in cls.__mro__:
        if "__call__" in klass.__dict__:
            return klass
    raise ValueError(f"{cls.__name__} has no __call__")


@contextlib.contextmanager
def exact_mode(model: nn.Module, level: "str | ExactPlan" = "auto") -> Iterator[None]:
    """Inside, a forward of ``model`` of width w computes each row as serial decoding would.

    ``level``: "auto" (the calibrated cheapest exact level per width, see ``calibrate``), or a
    fixed level for every width: "none", "attention", "attention+linear", "all", "serial", or a
    combination such as "attention+linear/4+experts/unsorted" (see ``ExactPlan.parse``).
    Entering is cheap (a few attribute swaps): enter it around each verification.
    """
    _warn_if_cudnn_attention()
    if level == "auto":
        resolve = _auto_resolver(model)
    else:
        plan = _parse(level)
        resolve = lambda width: plan  # noqa: E731
    hooked = _hooked_modules(model)
    patches = _op_patches() + [(_owner_of_call(type(m)), "__call__", _model_call) for m in hooked]
    done: list[tuple[Any, str]] = []
    ctx: _Context | None = None
    try:
        for owner, attribute, factory in patches:
            if (owner, attribute) in done:
                continue
            _install(owner, attribute, factory)
            done.append((owner, attribute))
        ctx = _Context({id(m) for m in hooked}, resolve)
        _contexts.append(ctx)
        yield
    finally:
        if ctx is not None and ctx in _contexts:
            _contexts.remove(ctx)
        for owner, attribute in reversed(done):
            _uninstall(owner, attribute)


_warned_cudnn = False


def _warn_if_cudnn_attention() -> None:
    global _warned_cudnn
    if _warned_cudnn or not cudnn_attention():
        return
    _warned_cudnn = True
    warnings.warn(
        "exact verification on CUDA with cuDNN attention on: cuDNN's decoding attention is not a "
        "function of the keys alone (on an H200 greedy outputs still differed from plain decoding "
        f"after ~280 keys on some prompts); specbench sets {CUDNN_ATTENTION_ENV}=0 when imported unless it "
        "is set: leave it unset, or import specbench before MLX first runs attention, for bit-identical output",
        stacklevel=3,
    )


@contextlib.contextmanager
def _suspended(model: nn.Module) -> Iterator[None]:
    """Plain (batched) forwards of ``model`` even inside an open ``exact_mode``."""
    with exact_mode(model, "none"):
        yield


class ExactVerifier:
    """Exact verification of one model, resolved once: ``verifier(inputs, cache, return_hidden)``.

    Equivalent to ``with exact_mode(model, level): forward(model, inputs, cache, return_hidden)``;
    ``widths`` calibrates those widths up front (so no verification pays for it later).
    """

    def __init__(self, model: nn.Module, level: "str | ExactPlan" = "auto", widths: Sequence[int] = ()):
        self.model = model
        self.level = level if level == "auto" else ExactPlan.parse(level)
        if level == "auto" and widths:
            calibrate(model, widths)

    def level_for(self, width: int) -> str:
        if self.level != "auto":
            return self.level.name
        return _auto_resolver(self.model)(width).name

    def __call__(self, inputs: mx.array, cache: list[Any], return_hidden: bool = False):
        from specbench.core.forward import forward

        with exact_mode(self.model, self.level):
            return forward(self.model, inputs, cache, return_hidden)


# -- calibration -----------------------------------------------------------------------------


@dataclass
class WidthCalibration:
    """What was tested at one width: each level's exactness (and seconds), and the pick."""

    width: int
    level: str
    tests: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Calibration:
    """The cheapest exact level per width for one model shape on one device and MLX version."""

    key: str
    device: str
    versions: dict[str, str]
    widths: dict[int, WidthCalibration] = field(default_factory=dict)

    def level_for(self, width: int) -> str:
        """The chosen level at ``width`` ("none" at width 1; KeyError if not calibrated)."""
        if width <= 1:
            return "none"
        return self.widths[width].level

    def rows(self) -> list[dict[str, Any]]:
        """One flat record per (width, tested level): for tables and CSV."""
        return [
            {"width": w, "chosen": c.level, **test}
            for w, c in sorted(self.widths.items())
            for test in c.tests
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "device": self.device,
            "versions": self.versions,
            "widths": {str(w): {"level": c.level, "tests": c.tests} for w, c in sorted(self.widths.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Calibration":
        widths = {
            int(w): WidthCalibration(int(w), c["level"], list(c.get("tests", [])))
            for w, c in data.get("widths", {}).items()
        }
        return cls(data["key"], data["device"], dict(data.get("versions", {})), widths)


#: Bumped when calibration tests more conditions, so that stored tables from before are not reused.
CALIBRATION_METHOD = 3
_calibrations: dict[str, Calibration] = {}
_keys: dict[int, tuple[weakref.ref, str]] = {}


def calibration_key(model: nn.Module) -> str:
    """Model shape (every parameter's name, shape and dtype), device and MLX / mlx-lm versions."""
    import hashlib

    from specbench.cost.profile import device_name, model_key, versions

    memo = _keys.get(id(model))
    if memo is not None and memo[0]() is model:
        return memo[1]
    vers, shape = versions(), model_key(model)
    attention = "|cudnn attention" if cudnn_attention() else ""
    text = f"{shape}|{device_name()}{attention}|mlx {vers['mlx']}|mlx_lm {vers['mlx_lm']}|method {CALIBRATION_METHOD}"
    key = f"{shape}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"
    _keys[id(model)] = (weakref.ref(model), key)
    return key


def calibration_dir() -> Path:
    from specbench.cost.profile import home

    return home() / "exact"


def _calibration_path(key: str) -> Path:
    return calibration_dir() / f"{key}.json"


def load_calibration(model: nn.Module) -> Calibration | None:
    """The calibration of ``model`` on this device, from memory or disk (None when there is none)."""
    key = calibration_key(model)
    if key in _calibrations:
        return _calibrations[key]
    path = _calibration_path(key)
    if path.exists():
        try:
            calibration = Calibration.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError):
            return None
        _calibrations[key] = calibration
        return calibration
    return None


def _save(calibration: Calibration) -> None:
    """Write ``calibration`` atomically, keeping widths another process stored meanwhile."""
    path = _calibration_path(calibration.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        try:
            stored = Calibration.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError):
            stored = None
        if stored is not None:
            for width, found in stored.widths.items():
                calibration.widths.setdefault(width, found)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(calibration.to_json(), f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _auto_resolver(model: nn.Module) -> Callable[[int], ExactPlan]:
    ref = weakref.ref(model)
    plans: dict[int, ExactPlan] = {}

    def resolve(width: int) -> ExactPlan:
        plan = plans.get(width)
        if plan is None:
            m = ref()
            if m is None:
                raise ValueError("the model of this exact_mode was freed")
            calibration = load_calibration(m)
            if calibration is None or width not in calibration.widths:
                calibration = calibrate(m, [width])
            plan = plans[width] = _parse(calibration.level_for(width))
        return plan

    return resolve


def _has_experts(model: nn.Module) -> bool:
    return any(
        isinstance(m, (switch_layers.SwitchGLU, switch_layers.SwitchMLP)) for _, m in model.named_modules()
    )


def _candidates(width: int, moe: bool) -> list[list[str]]:
    """Levels to test at ``width``, in groups: each group relaxes one op family of the full
    split to cheaper schemes (the other families stay split row by row)."""
    chunks = [c for c in (8, 4, 2) if c < width]
    linear = ["attention+linear/vector", *[f"attention+linear/{c}" for c in chunks]]
    experts = "+experts" if moe else ""
    groups = [
        ["none"],
        [f"linear{experts}"],  # attention batched
        [level + experts for level in ["attention", *linear]],  # linear relaxed
    ]
    if moe:
        groups.append(["attention+linear", "attention+linear+experts/unsorted"])  # experts relaxed
    groups.append([f"attention+linear{experts}"])  # the full split
    return groups


def _combine(picks: dict[str, str], moe: bool) -> str:
    """Merge each family's cheapest exact scheme into one level."""
    parts = []
    if picks.get("attention", "split") == "split":
        parts.append("attention")
    if picks.get("linear") != "batched":
        parts.append(picks.get("linear", "linear"))
    if moe and picks.get("experts") != "batched":
        parts.append(picks.get("experts", "experts"))
    return ExactPlan.parse("+".join(parts) or "none").name


def _family_scheme(level: str, family: str) -> str:
    plan = ExactPlan.parse(level)
    if family == "attention":
        return "split" if plan.attention else "batched"
    value = getattr(plan, family)
    if value is None:
        return "batched"
    return family if value == 1 else f"{family}/{value}"


def calibrate(
    model: nn.Module,
    widths: int | Sequence[int] = 16,
    offset: int = 32,
    measure: bool = True,
    repeats: int = 3,
    seed: int = 0,
    save: bool = True,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
    boundary: bool = True,
) -> Calibration:
    """Find, per width, the cheapest level whose forward is bit-identical to serial steps.

    For each width w (an int W means 2..W) a cache holding ``offset`` random tokens is extended
    by w random tokens, once with w single-token steps (the reference) and once per tested
    level (logits compared bit for bit). With ``boundary`` the same is checked at a cache whose
    verification crosses the first KV buffer step (256 keys), laid out as a speculative
    verification leaves it, on a GPU (the CPU's attention reads exactly the keys it attends);
    a level counts as exact only if it is exact on both. Levels are
    tested per op family: "none" first; then,
    with the other families split row by row, each family's cheaper schemes (attention batched;
    linear batched, vector, in chunks; experts batched, unsorted). The cheapest exact scheme of
    each family (by median seconds of ``repeats`` forwards when ``measure``, else the first
    exact one in that order) are combined and the combination checked; "serial" (exact by
    construction) is the fallback and is also timed. Results are merged into the model's
    stored calibration (memory, and disk unless ``save`` is False); widths it already holds are
    kept unless ``force``.
    """
    ws = list(range(2, widths + 1)) if isinstance(widths, int) else sorted({int(w) for w in widths})
    if not ws or ws[0] < 1:
        raise ValueError(f"widths must be an int W >= 2 (for 2..W) or widths >= 1, got {widths!r}")
    if offset < 1:
        raise ValueError(f"offset must be >= 1, got {offset}")
    from specbench.cost.profile import device_name, versions

    key = calibration_key(model)
    calibration = load_calibration(model) or Calibration(key, device_name(), versions())
    ws = [w for w in ws if w > 1 and (force or w not in calibration.widths)]
    if not ws:
        return calibration
    moe = _has_experts(model)
    rng = np.random.default_rng(seed)
    say = progress or (lambda text: None)
    with _suspended(model):
        probes = [_Probe(model, offset, max(ws), rng)]
        # The CPU's kernels read exactly the keys they attend; a GPU's may not (cuDNN's do not).
        on_gpu = mx.default_device().type == mx.DeviceType.gpu
        crossing = _boundary_offset(model, max(ws)) if boundary and (on_gpu or layout_sensitive_attention()) else None
        if crossing is not None:
            # The layout a verification that crossed the step two tokens earlier leaves.
            probes.append(_Probe(model, crossing, max(ws), rng, extent=crossing - 2 + KVCache.step))
    probe = _Probes(probes)
    for w in ws:
        calibration.widths[w] = _calibrate_width(model, probe, w, moe, measure, repeats)
        say(f"width {w}: {calibration.widths[w].level}")
    _calibrations[key] = calibration
    if save:
        _save(calibration)
    return calibration


class _Probe:
    """A prefilled cache in a given KV layout, probe tokens and the serial reference logits.

    The reference is w single-token steps from a cache laid out as serial decoding lays it out;
    before each tested forward the cache gets the same contents back, with its KV buffers
    ``extent`` rows long (None: the serial layout; else e.g. the ``offset + 256`` rows a
    verification that crossed a buffer step leaves).
    """

    def __init__(self, model: nn.Module, offset: int, width: int, rng: np.random.Generator, extent: int | None = None):
        from specbench.core.engine import vocab_size

        self.model = model
        self.offset = offset
        self.extent = extent
        self.cache = make_prompt_cache(model)
        vocab = vocab_size(model)
        prompt = mx.array(rng.integers(0, vocab, size=offset), dtype=mx.uint32)
        model(prompt[None], cache=self.cache)
        mx.eval([c.state for c in self.cache])
        self.saved = self._save_state()
        self.tokens = mx.array(rng.integers(0, vocab, size=width), dtype=mx.uint32)[None]
        reference = []
        for i in range(width):
            out = model(self.tokens[:, i : i + 1], cache=self.cache)
            mx.eval(out)
            reference.append(np.array(out[0, 0].astype(mx.float32)))
        self.reference = np.stack(reference)
        self.restore(width)

    def _save_state(self) -> list[Any]:
        saved: list[Any] = []
        for c in self.cache:
            if type(c) is KVCache and c.keys is not None:
                # Separate arrays: a cache update may write into its buffer in place.
                kv = (mx.contiguous(c.keys[..., : c.offset, :]), mx.contiguous(c.values[..., : c.offset, :]))
                mx.eval(kv)
                saved.append(kv)
            else:
                saved.append(None if c.is_trimmable() else _copy_state(c.state))
        return saved

    def restore(self, n: int) -> None:
        for c, saved in zip(self.cache, self.saved):
            if isinstance(saved, tuple) and type(c) is KVCache:
                extent = self.extent or _serial_extent(self.offset, c.step)
                c.keys = _with_extent(saved[0], self.offset, extent)
                c.values = _with_extent(saved[1], self.offset, extent)
                c.offset = self.offset
            elif saved is None:
                c.trim(n)
            else:
                c.state = _copy_state(saved)
        mx.eval([c.state for c in self.cache])

    def run(self, level: str, width: int) -> tuple[bool, float]:
        """Whether ``level`` reproduces the serial logits at ``width``, and its seconds."""
        with exact_mode(self.model, level):
            mx.synchronize()
            t0 = time.perf_counter()
            out = self.model(self.tokens[:, :width], cache=self.cache)
            mx.eval(out)
            seconds = time.perf_counter() - t0
        self.restore(width)
        got = np.array(out[0].astype(mx.float32))
        return bool(np.array_equal(got, self.reference[:width])), seconds


class _Probes:
    """Calibration probes: the first (serial layout) is timed; a level is exact when it
    reproduces the serial logits on all of them."""

    def __init__(self, probes: list[_Probe]):
        self.probes = probes

    def run(self, level: str, width: int) -> tuple[bool, float]:
        exact, seconds = self.probes[0].run(level, width)
        for probe in self.probes[1:]:
            exact = exact and probe.run(level, width)[0]
        return exact, seconds

    def time(self, level: str, width: int, repeats: int) -> float:
        return statistics.median(self.probes[0].run(level, width)[1] for _ in range(repeats))


def _boundary_offset(model: nn.Module, width: int) -> int | None:
    """An offset whose verifications (of any width >= 2) cross the first KV buffer step: row 0
    attends a full 256-row buffer, the later rows a longer one (None for models without a
    plain ``KVCache`` or with a shorter context)."""
    from specbench.core.engine import context_length

    limit = context_length(model)
    if limit is not None and KVCache.step - 1 + width > limit:
        return None
    if not any(type(c) is KVCache for c in make_prompt_cache(model)):
        return None
    return KVCache.step - 1


def _copy_state(state: Any) -> Any:
    """A copy of a cache's state containers (arrays are immutable; lists are updated in place)."""
    if isinstance(state, (list, tuple)):
        return type(state)(_copy_state(x) for x in state)
    return state


def _calibrate_width(model, probe: _Probes, width: int, moe: bool, measure: bool, repeats: int) -> WidthCalibration:
    tests: list[dict[str, Any]] = []

    def test(level: str, timed: bool = True) -> bool:
        level = ExactPlan.parse(level).name
        exact, _ = probe.run(level, width)  # also the warm-up
        seconds = probe.time(level, width, repeats) if exact and measure and timed else None
        tests.append({"level": level, "exact": exact, "seconds": seconds})
        return exact

    if test("none", timed=False):  # the batched forward: nothing is cheaper
        return WidthCalibration(width, "none", tests)
    groups = _candidates(width, moe)
    full = groups[-1][0]
    families = ["attention", "linear"] + (["experts"] if moe else [])
    picks: dict[str, str] = {}
    for family, group in zip(families, groups[1:-1]):
        best: tuple[float, str] | None = None
        for order, level in enumerate(group):
            if test(level):
                cost = tests[-1]["seconds"] if measure else float(order)
                if best is None or cost < best[0]:
                    best = (cost, _family_scheme(level, family))
                if not measure:
                    break
        if best is not None:
            picks[family] = best[1]
    options: list[tuple[float, str]] = []
    for level in dict.fromkeys([_combine(picks, moe), ExactPlan.parse(full).name]):
        tested = {t["level"]: t for t in tests}
        if level in tested:
            exact, seconds = tested[level]["exact"], tested[level]["seconds"]
        else:
            exact = test(level)
            seconds = tests[-1]["seconds"]
        if exact:
            options.append((seconds or 0.0, level))
            break
    if measure or not options:
        seconds = probe.time("serial", width, repeats) if measure else None
        tests.append({"level": "serial", "exact": True, "seconds": seconds})
        options.append((seconds if seconds is not None else float("inf"), "serial"))
    level = min(options)[1] if measure else options[0][1]
    return WidthCalibration(width, level, tests)


# -- op probe --------------------------------------------------------------------------------


def probe_ops(
    dtype: mx.Dtype = mx.bfloat16, widths: Sequence[int] = (2, 4, 8, 16), dim: int = 512, seed: int = 0
) -> list[dict[str, Any]]:
    """Which ops compute each row as they do for one row, on the current device.

    Each op is applied to w rows at once and to each row alone (a decode step's call), and
    the results compared bit for bit. The ops are those every mlx-lm transformer runs besides
    the split ones (embedding, RMSNorm, RoPE at an offset, SwiGLU, residual add, router
    softmax and top-k, the weighted sum over experts, logsumexp and argmax over the vocabulary),
    plus the split ones for contrast (matmul, quantized matmul, attention).
    """
    mx.random.seed(seed)
    heads, head_dim, vocab, experts, top_k, offset = 8, 64, 4096, 64, 8, 100
    rows: list[dict[str, Any]] = []

    def rand(*shape):
        return mx.random.normal(shape).astype(dtype)

    weight = rand(dim) + 1
    linear = rand(dim * 2, dim) / dim**0.5
    qw, qs, qb = mx.quantize(linear, group_size=64, bits=4)
    embed = rand(vocab, dim)
    keys, values = rand(1, heads // 4, offset + max(widths), head_dim), rand(1, heads // 4, offset + max(widths), head_dim)

    def swiglu(x):
        half = x.shape[-1] // 2
        return nn.silu(x[..., :half]) * x[..., half:]

    def topk(x):
        return mx.sort(mx.argpartition(x, kth=-top_k, axis=-1)[..., -top_k:], axis=-1)

    ops: dict[str, tuple[Callable[[int], mx.array], Callable[[mx.array, int, int], mx.array]]] = {
        # name: (input for w rows, f(x, first_row, rows)) computing the op over rows [first, first+rows)
        "embedding": (lambda w: mx.random.randint(0, vocab, (1, w)), lambda x, i, n: embed[x]),
        "rms_norm": (lambda w: rand(1, w, dim), lambda x, i, n: mx.fast.rms_norm(x, weight, 1e-6)),
        "rope": (
            lambda w: rand(1, heads, w, head_dim),
            lambda x, i, n: mx.fast.rope(x, head_dim, traditional=False, base=1e6, scale=1.0, offset=offset + i),
        ),
        "swiglu": (lambda w: rand(1, w, dim), lambda x, i, n: swiglu(x)),
        "residual_add": (lambda w: rand(1, w, dim), lambda x, i, n: x + x[..., ::-1]),
        "router_softmax": (lambda w: rand(1, w, experts), lambda x, i, n: mx.softmax(x, axis=-1, precise=True)),
        "router_topk": (lambda w: rand(1, w, experts), lambda x, i, n: topk(x)),
        "expert_sum": (  # experts' outputs weighted by the router's scores (here: the first column)
            lambda w: rand(1, w, top_k, dim),
            lambda x, i, n: (x * x[..., :1]).sum(axis=-2).astype(x.dtype),
        ),
        "logsumexp": (lambda w: rand(w, vocab), lambda x, i, n: mx.logsumexp(x, axis=-1, keepdims=True)),
        "argmax": (lambda w: rand(w, vocab), lambda x, i, n: mx.argmax(x - mx.logsumexp(x, axis=-1, keepdims=True), axis=-1)),
        "matmul": (lambda w: rand(1, w, dim), lambda x, i, n: x @ linear.T),
        "quantized_matmul": (
            lambda w: rand(1, w, dim),
            lambda x, i, n: mx.quantized_matmul(x, qw, qs, qb, transpose=True, group_size=64, bits=4),
        ),
        "attention": (
            lambda w: rand(1, heads, w, head_dim),
            lambda x, i, n: mx.fast.scaled_dot_product_attention(
                x, keys[..., : offset + i + n, :], values[..., : offset + i + n, :], scale=head_dim**-0.5,
                mask="causal" if n > 1 else None,
            ),
        ),
    }
    for name, (make, op) in ops.items():
        for w in widths:
            x = make(w)
            row_axis = 0 if x.ndim == 2 and name in ("logsumexp", "argmax") else (2 if name in ("rope", "attention") else 1)
            together = op(x, 0, w)
            alone = [
                op(mx.take(x, mx.array([i]), axis=row_axis), i, 1) for i in range(w)
            ]
            out_axis = row_axis if together.ndim > row_axis else 0
            joined = mx.concatenate(alone, axis=out_axis)
            mx.eval(together, joined)
            a, b = np.array(together.astype(mx.float32) if together.dtype != mx.uint32 else together), np.array(
                joined.astype(mx.float32) if joined.dtype != mx.uint32 else joined
            )
            rows.append({"op": name, "dtype": str(dtype).split(".")[-1], "width": w, "row_invariant": bool(np.array_equal(a, b))})
    return rows
