"""The split: a width-w forward whose layers run row by row through a decode step's calls.

On a GPU a forward over w tokens is not bit-identical to w single-token steps: matrix products over w rows and
attention over w queries run other kernels (other reduction orders) than the 1-row products and the single-query
attention of a decode step. Inside ``split_mode(model, plans)`` the layers that differ are run row by row through
the very calls a decode step makes, as the plan for the forward's width says (``specbench.exact.plan``). Every other
op of the mlx-lm models (embedding, RMSNorm, RoPE at an offset, elementwise ops, softmax and top-k routing, residual
sums) computes each row on its own: ``probe_ops`` checks that on the current device. The KV caches get the layout
serial decoding gives them (``specbench.exact.layout``); row-invariant kernels compute a layer's rows in one call
where the device's probe proved them (``specbench.exact.kernel_calls``).

The split is installed by swapping the ``__call__`` of those classes (and the attention function) while the context
is open: no model file is copied, and every mlx-lm model that builds on these layers is covered. ``SplitVerifier``
runs the decode loop's verifications through it.

A forward over mlx-lm's ``BatchKVCache`` (a batch of requests, ``specbench.core.batch``) is split the same way, its
B x w rows as one request's w rows are, 1-row steps of B requests included: linear layers and experts take all
B·w rows, and attention row (b, i) attends exactly the keys request b's own serial step attends (from its left
padding ``starts[b]`` on, no mask). Where a kernel does not take a call (its shape, dtype or probe), the rows run
through the layer's own calls, and the reason is counted in the context's ``fallbacks``.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import base as mlx_base
from mlx_lm.models import switch_layers

from specbench.core.tree import open_trees, tree_forward, visible_rows
from specbench.core.verify import Verifier, VerifyMode, forward, greedy
from specbench.exact.kernel_calls import kernel_attention, kernel_product, why_no_kernel
from specbench.exact.layout import (
    CUDNN_ATTENTION_ENV,
    batch_starts,
    clear_rejected,
    cudnn_attention,
    layout_sensitive_attention,
    serial_kv_layout,
    serial_kv_rows,
    tree_attention,
)
from specbench.exact.plan import ExactPlan

#: mlx-lm sorts the tokens routed to experts when ``indices.size >= 64`` (switch_layers.py).
_MLX_LM_SORT_THRESHOLD = 64

#: The plan for a forward's width, or one level for every width.
Plans = Callable[[int], ExactPlan] | str | ExactPlan


class _Context:
    """One open ``split_mode``: its models, how it picks a plan for a width, the length of the KV buffers of the
    forward that runs (None when unknown or not uniform), each batch row's first key while a forward over a batch
    cache runs (``starts``), and the kernel fallbacks counted by reason (``fallbacks``)."""

    def __init__(
        self,
        models: set[int],
        resolve: Callable[[int], ExactPlan],
        compiled: bool = False,
        fallbacks: Counter[str] | None = None,
    ):
        self.models = models
        self.resolve = resolve
        self.compiled = compiled
        self.plan: ExactPlan | None = None
        self.kv_extent: int | None = None
        self.starts: list[int] | None = None
        self.fallbacks = fallbacks if fallbacks is not None else Counter()
        self.layout_sensitive = layout_sensitive_attention()

    def plan_for(self, rows: int, batched: bool = False) -> ExactPlan | None:
        """The plan for a call over ``rows`` rows (None: one call); ``batched``: attention over a batch cache, split
        whatever its rows (a single row still must not see its left padding)."""
        if rows <= 1 and not (batched and self.starts is not None):
            return None
        return self.plan if self.plan is not None else self.resolve(max(rows, 2))


_contexts: list[_Context] = []


def _plan(rows: int, batched: bool = False) -> ExactPlan | None:
    return _contexts[-1].plan_for(rows, batched) if _contexts else None


@contextlib.contextmanager
def _outside() -> Iterator[None]:
    """No exact context while a kernel runs: its probe (on first use, inside a forward) compares it with MLX's own
    attention, which must run as MLX runs it, not through this split with the forward's batch layout."""
    saved = _contexts[:]
    _contexts.clear()
    try:
        yield
    finally:
        _contexts[:] = saved


def _fallback(family: str, reason: str) -> None:
    """Count a call of ``family`` that a kernel its level names did not take, by ``reason``."""
    if _contexts:
        _contexts[-1].fallbacks[f"{family}: {reason}"] += 1


def _serial_kv_row(keys: mx.array, values: mx.array, n: int) -> tuple[mx.array, mx.array]:
    """Keys and values ``[..., :n, :]`` as a serial step attending ``n`` keys sees them, in the
    KV layout of the forward that runs."""
    ctx = _contexts[-1] if _contexts else None
    if ctx is None:
        return keys[..., :n, :], values[..., :n, :]
    return serial_kv_rows(keys, values, n, ctx.kv_extent, ctx.layout_sensitive)


# -- the split calls -------------------------------------------------------------------------


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


#: Compiled chunked products, by (kind, rows per call, the layer's settings and parameter names).
_compiled_products: dict[tuple, Callable] = {}


def _chunked_product(key: tuple) -> Callable:
    """``x`` [1, n, K] through a linear layer's product ``rows`` rows per call, as its ``__call__`` computes
    each chunk (``mx.quantized_matmul`` or ``addmm`` / ``@``), rejoined; the parameters passed by name."""
    kind, rows, settings, names = key

    def product(x: mx.array, *params: mx.array) -> mx.array:
        p = dict(zip(names, params))
        parts = []
        for i in range(0, x.shape[1], rows):
            part = x[:, i : i + rows]
            if kind == "quantized":
                group_size, bits, mode = settings
                y = mx.quantized_matmul(
                    part,
                    p["weight"],
                    scales=p["scales"],
                    biases=p.get("biases"),
                    transpose=True,
                    group_size=group_size,
                    bits=bits,
                    mode=mode,
                )
                y = y + p["bias"] if "bias" in p else y
            else:
                y = mx.addmm(p["bias"], part, p["weight"].T) if "bias" in p else part @ p["weight"].T
            parts.append(y)
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1)

    return product


def _compiled_chunks(layer: nn.Module, x: mx.array, rows: int) -> mx.array | None:
    """``layer(x)`` in chunks of ``rows`` rows through one ``mx.compile``d function (None: not a plain
    ``nn.Linear`` / ``nn.QuantizedLinear``): one call per layer instead of a few ops per chunk."""
    if type(layer) is nn.QuantizedLinear:
        kind, settings = "quantized", (layer.group_size, layer.bits, layer.mode)
    elif type(layer) is nn.Linear:
        kind, settings = "linear", ()
    else:
        return None
    names = tuple(name for name in ("weight", "scales", "biases", "bias") if name in layer)
    key = (kind, rows, settings, names)
    if key not in _compiled_products:
        _compiled_products[key] = mx.compile(_chunked_product(key))
    flat = x.reshape(1, -1, x.shape[-1])
    out = _compiled_products[key](flat, *(layer[name] for name in names))
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _linear_call(original: Callable, vector: Callable | None) -> Callable:
    def call(self, x: mx.array, *args, **kwargs) -> mx.array:
        plan = _plan(x.size // x.shape[-1]) if x.ndim >= 2 else None
        if plan is None or plan.linear is None:
            return original(self, x, *args, **kwargs)
        if isinstance(plan.linear, int) and (plan.compiled or _contexts[-1].compiled) and not args and not kwargs:
            out = _compiled_chunks(self, x, plan.linear)
            if out is not None:
                return out
        if plan.linear == "kernel":
            out = kernel_product(self, x)
            if out is not None:
                return out
            _fallback("linear", why_no_kernel(self, x))
            return _in_chunks(lambda part: original(self, part, *args, **kwargs), x, 1)
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
            original(self, flat_x[:, i : i + rows], flat_i[:, i : i + rows], *args, **kwargs) for i in range(0, n, rows)
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


def _is_causal(mask: Any) -> bool:
    return isinstance(mask, str) and mask == "causal" or isinstance(mask, mx.array)


def _attention_call(original: Callable) -> Callable:
    def sdpa(queries, keys, values, *args, scale: float, mask: Any = None, **kwargs):
        rows = queries.shape[-2]
        starts = _contexts[-1].starts if _contexts else None
        plan = _plan(rows * queries.shape[0], batched=True)
        if starts is not None and plan is not None and plan.attention:
            return _batch_attention(original, plan, queries, keys, values, scale, starts, args, kwargs)
        visible = visible_rows(rows) if plan is not None and open_trees else None
        if visible is not None:  # a token tree: always row by row (its mask is no causal one)
            sensitive = _contexts[-1].layout_sensitive
            return tree_attention(original, queries, keys, values, visible, scale, sensitive, *args, **kwargs)
        if plan is None or not plan.attention or not _is_causal(mask):
            return original(queries, keys, values, *args, scale=scale, mask=mask, **kwargs)
        call = (plan, queries, keys, values, scale, mask, args, kwargs, _contexts[-1].layout_sensitive)
        if plan.attention == "kernel":  # else no kernel code runs
            with _outside():
                out = kernel_attention(*call)
            if not isinstance(out, str):
                return out
            _fallback("attention", out)
        prefix = keys.shape[-2] - rows
        outs = []
        for i in range(rows):
            n = prefix + i + 1
            row_keys, row_values = _serial_kv_row(keys, values, n)
            outs.append(
                original(
                    mx.contiguous(queries[..., i : i + 1, :]),
                    row_keys,
                    row_values,
                    *args,
                    scale=scale,
                    mask=_row_mask(mask, i, n),
                    **kwargs,
                )
            )
        return mx.concatenate(outs, axis=-2)

    sdpa.__wrapped__ = original
    return sdpa


def _batch_attention(original: Callable, plan: ExactPlan, queries, keys, values, scale: float, starts, args, kwargs):
    """A batch cache's [B, w] block: row (b, i) over keys ``[starts[b] : N - w + i + 1]`` with no mask, as request
    b's own serial step attends them (mlx-lm's ``BatchKVCache`` keeps each row's left padding); through one
    ``attention_rows`` call where the level and the device's probe allow it, else row by row."""
    rows = queries.shape[-2]
    if plan.attention == "kernel":
        mask = "causal" if rows > 1 else None
        with _outside():
            out = kernel_attention(plan, queries, keys, values, scale, mask, args, kwargs, False, starts)
        if not isinstance(out, str):
            return out
        _fallback("attention", out)
    prefix = keys.shape[-2] - rows
    batch = []
    for b, start in enumerate(starts):
        outs = [
            original(
                mx.contiguous(queries[b : b + 1, :, i : i + 1]),
                keys[b : b + 1, :, start : prefix + i + 1],
                values[b : b + 1, :, start : prefix + i + 1],
                *args,
                scale=scale,
                mask=None,
                **kwargs,
            )
            for i in range(rows)
        ]
        batch.append(mx.concatenate(outs, axis=-2))
    return mx.concatenate(batch, axis=0)


def _quantized_attention_call(original: Callable) -> Callable:
    def qsdpa(queries, q_keys, q_values, scale, mask, group_size: int = 64, bits: int = 8):
        rows = queries.shape[-2]
        plan = _plan(rows)
        if plan is None or not plan.attention or not _is_causal(mask):
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
        if plan is not None and plan.serial and tree_forward(width):
            plan = ExactPlan.parse("all")  # a token tree runs as one forward: every layer row by row
        if plan is None or not plan.serial:
            saved = ctx.kv_extent, ctx.starts
            ctx.kv_extent = serial_kv_layout(cache, max(width, 1))
            ctx.starts = batch_starts(cache)
            ctx.plan = plan if plan is not None else ctx.plan
            try:
                return original(self, inputs, *args, **kwargs)
            finally:
                ctx.kv_extent, ctx.starts = saved
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


# -- installing the split ----------------------------------------------------------------------


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


#: (id of owner, attribute) -> (owner, original, how many open contexts installed it).
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
def split_mode(
    model: nn.Module, plans: Plans, compiled: bool = False, fallbacks: Counter[str] | None = None
) -> Iterator[None]:
    """Inside, a forward of ``model`` of width w runs the layers ``plans(w)`` names row by row.

    ``plans``: a function of the width, or one level for every width (see ``ExactPlan.parse``).
    Entering is cheap (a few attribute swaps). ``specbench.exact.exact_mode`` opens it with the
    calibrated cheapest exact level per width. ``compiled``: linear layers split in chunks run each
    layer's chunks through one ``mx.compile``d function (the same products, fewer graph nodes), as
    they do at every width whose plan says so (a level's ``+compiled`` part). ``fallbacks``: where the calls a
    kernel of the level did not take are counted, by reason.
    """
    _warn_if_cudnn_attention()
    fixed = None if callable(plans) else ExactPlan.parse(plans)
    resolve = plans if fixed is None else (lambda width: fixed)
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
        ctx = _Context({id(m) for m in hooked}, resolve, compiled, fallbacks)
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
        stacklevel=4,
    )


# -- the verifier through the split -----------------------------------------------------------------------------------


class SplitVerifier(Verifier):
    """The decode loop's verifier through the split: a verification of ``model`` runs inside ``split_mode`` with the
    plans of ``level`` (``plans_of``, once per generation), each row's greedy choice made on its own as a serial step
    makes it. Where attention depends on the KV buffer's layout (``layout_sensitive_attention``), plain steps get serial
    decoding's buffer and rejected rows are zeroed. ``specbench.exact.ExactVerifier`` adds the calibrated "auto"."""

    mode: VerifyMode = "exact"

    def __init__(self, model: nn.Module, level: str | ExactPlan):
        self.model = model
        self.level = level
        self.clears_rejected = layout_sensitive_attention()
        #: Calls a kernel of the level did not take (they ran through the layer's own calls), by reason.
        self.fallbacks: Counter[str] = Counter()
        self._laid_out: list[Any] | None = None  # the cache last given serial decoding's layout
        self._plans: Plans | None = None  # the generation's, while one runs

    def plans_of(self, model: nn.Module) -> Plans:
        """The plans a verification of ``model`` runs with: ``level`` for every width."""
        return self.level

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """One generation: its plans prepared once (a calibration read once), used by every verification in it."""
        self._plans = self.plans_of(self.model)
        try:
            yield
        finally:
            self._plans = None

    def forward(
        self, model: nn.Module, inputs: mx.array, cache: list[Any], return_hidden: bool = False
    ) -> mx.array | tuple[mx.array, mx.array]:
        self._laid_out = None
        # The split's class patches go in around each verification: in and out they cost ~0.2 ms, while left in for a
        # generation their wrappers add ~0.9 ms to every plain step (SmolLM2-135M on a CPU, building its graph).
        plans = self._plans if self._plans is not None and model is self.model else self.plans_of(model)
        with split_mode(model, plans, fallbacks=self.fallbacks):
            return forward(model, inputs, cache, return_hidden)

    def greedy(self, logits: mx.array) -> list[int]:
        return mx.concatenate([greedy(logits[i : i + 1]) for i in range(logits.shape[0])]).tolist()

    def before_plain_step(self, cache: list[Any]) -> None:
        # Once laid out, plain steps grow the buffers as serial decoding does: only a verification moves them.
        if self._laid_out is not cache:
            serial_kv_layout(cache, 1)
            self._laid_out = cache

    def after_rewind(self, cache: list[Any], rejected: int) -> None:
        self._laid_out = None
        if self.clears_rejected:
            clear_rejected(cache, rejected)
