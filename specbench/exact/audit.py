"""The audit: a sample of exact verifications compared with serial steps while a generation runs.

Calibration proves a level exact on probes; a device, driver or context it never saw may still differ. With an
audit rate r, each verification is checked with probability r: its logits against those of single-token steps from
the same cache (the verification's rows rolled back, then stepped serially). On the first mismatch the generation
goes on from the serial steps' logits and caches, verifies by serial steps from then on (exact by construction),
warns once, and the verification is replayed op by op (``first_divergence``) to name the first operation whose
output differs: its layer, op, width, cache length and largest difference (``Divergence``). ``AuditResult`` is
what a generation's stats carry (``stats()["exact_audit"]``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import base as mlx_base

from specbench.core.verify import forward
from specbench.exact.hooks import Plans, split_mode
from specbench.exact.layout import cache_length, serial_kv_layout


def check_audit_rate(rate: object) -> float:
    """``rate`` as a float in [0, 1], else one clear error (what it is, what to give)."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        raise TypeError(f"audit must be a rate in [0, 1] (a number), got {rate!r} ({type(rate).__name__})")
    if not 0.0 <= float(rate) <= 1.0:  # NaN fails too
        raise ValueError(
            f"audit must be a rate in [0, 1] (the share of verifications compared with serial steps; 0: none), "
            f"got {rate!r}"
        )
    return float(rate)


@dataclass(frozen=True)
class Divergence:
    """The first operation whose output differed between a verification and serial steps from the same cache.

    ``layer``: the decoder layer (None for an op outside the layers, e.g. the output head); ``op``: its path inside
    the layer (``self_attn.q_proj``, ``self_attn.scaled_dot_product_attention``, ``mlp.down_proj``); ``width``: the
    verification's rows; ``cache_length``: tokens cached before it; ``max_abs_diff``: the largest difference of the
    op's outputs; ``row``: the first row that differs; ``level``: the exact level the verification ran at."""

    layer: int | None
    op: str
    width: int
    cache_length: int
    max_abs_diff: float
    row: int
    level: str

    def __str__(self) -> str:
        where = f"layer {self.layer} {self.op}" if self.layer is not None else self.op
        return (
            f"{where} at width {self.width}, cache length {self.cache_length}: largest difference "
            f"{self.max_abs_diff:.3g} (first at row {self.row}; level {self.level})"
        )


@dataclass
class AuditResult:
    """One generation's audit: ``rate``, verifications ``audited`` and ``mismatches`` among them, the first one's
    ``divergence``, ``fell_back_at`` (the verification, counted from 1, after which every verification ran
    serially), ``calibrated`` (times a width was calibrated further, its cache longer than its calibration
    reached) and ``beyond_reach`` (verifications run serially where the model's context left no room to)."""

    rate: float
    verifications: int = 0
    audited: int = 0
    mismatches: int = 0
    calibrated: int = 0
    beyond_reach: int = 0
    divergence: Divergence | None = None
    fell_back_at: int | None = None

    def summary(self) -> str:
        """One line for the CLI and the report."""
        text = f"{self.audited} of {self.verifications} verifications compared with serial steps (rate {self.rate:g})"
        if self.divergence is not None:
            text += (
                f"; MISMATCH, serial steps from verification {self.fell_back_at} on (output exact); first diverging "
                f"operation: {self.divergence}"
            )
        elif self.audited:
            text += "; all bit-identical"
        if self.calibrated:
            text += f"; {self.calibrated} width(s) calibrated further during generation (cache past the calibration)"
        if self.beyond_reach:
            text += f"; {self.beyond_reach} ran serially past the calibrated cache lengths"
        return text


def can_audit(cache: Sequence[Any]) -> bool:
    """Whether a verification's rows can be rolled back and stepped again (every cache trimmable)."""
    return all(c.is_trimmable() for c in cache)


def rewind(cache: Sequence[Any], n: int) -> None:
    for c in cache:
        c.trim(n)


def serial_forward(
    model: nn.Module, inputs: mx.array, cache: list[Any], return_hidden: bool = False
) -> mx.array | tuple[mx.array, mx.array]:
    """``inputs`` ([1, w]) as w single-token steps, the caches laid out as serial decoding lays them out: the
    logits (and hidden states) of the w rows joined."""
    logits, hidden = [], []
    for i in range(inputs.shape[1]):
        serial_kv_layout(cache, 1)
        out = forward(model, inputs[:, i : i + 1], cache, return_hidden)
        mx.eval(out)
        logits.append(out[0] if isinstance(out, tuple) else out)
        hidden += [out[1]] if isinstance(out, tuple) else []
    joined = mx.concatenate(logits, axis=1)
    return (joined, mx.concatenate(hidden, axis=1)) if return_hidden else joined


# -- naming the first diverging operation -------------------------------------------------------------------------


class _Trace:
    """Every module call's output (by module path, evaluated) and every attention call's, step by step."""

    def __init__(self, model: nn.Module):
        self.names = {id(m): name or "output" for name, m in model.named_modules()}
        self.stack: list[str] = []
        self.steps: list[list[tuple[str, mx.array]]] = [[]]

    def record(self, name: str, out: Any) -> None:
        if isinstance(out, mx.array):
            mx.eval(out)
            self.steps[-1].append((name, out))

    def new_step(self) -> None:
        self.steps.append([])


@contextlib.contextmanager
def _traced(model: nn.Module) -> Iterator[_Trace]:
    """Record the outputs of ``model``'s module calls (its classes' ``__call__``, embeddings' ``as_linear``) and of
    attention (``mx.fast.scaled_dot_product_attention``, mlx-lm's quantized attention), outermost: inside an open
    split they record what the split computes."""
    trace = _Trace(model)
    owners: dict[tuple[int, str], tuple[Any, str, Any]] = {}
    for _, module in model.named_modules():
        for attribute in ("__call__", "as_linear"):
            owner = next((k for k in type(module).__mro__ if attribute in k.__dict__), None)
            if owner is not None and (id(owner), attribute) not in owners:
                owners[(id(owner), attribute)] = (owner, attribute, owner.__dict__[attribute])
    patched: list[tuple[Any, str, Any]] = list(owners.values())
    patched += [(mx.fast, "scaled_dot_product_attention", mx.fast.scaled_dot_product_attention)]
    patched += [(mlx_base, "quantized_scaled_dot_product_attention", mlx_base.quantized_scaled_dot_product_attention)]

    def module_call(original: Callable, attribute: str) -> Callable:
        def call(self, *args, **kwargs):
            name = trace.names.get(id(self))
            if name is None:
                return original(self, *args, **kwargs)
            name = name if attribute == "__call__" else f"{name}.{attribute}"
            trace.stack.append(name)
            try:
                out = original(self, *args, **kwargs)
            finally:
                trace.stack.pop()
            trace.record(name, out)
            return out

        return call

    def attention_call(original: Callable, label: str) -> Callable:
        def call(*args, **kwargs):
            out = original(*args, **kwargs)
            trace.record(f"{trace.stack[-1] if trace.stack else 'model'}.{label}", out)
            return out

        return call

    try:
        for owner, attribute, original in patched:
            if owner is mx.fast or owner is mlx_base:
                setattr(owner, attribute, attention_call(original, attribute))
            else:
                setattr(owner, attribute, module_call(original, attribute))
        yield trace
    finally:
        for owner, attribute, original in reversed(patched):
            setattr(owner, attribute, original)


def _keyed(records: list[tuple[str, mx.array]]) -> list[tuple[tuple[str, int], mx.array]]:
    """Records keyed by (path, how many calls of it came before in this forward): RoPE runs twice per layer."""
    seen: dict[str, int] = {}
    out = []
    for name, value in records:
        out.append(((name, seen.get(name, 0)), value))
        seen[name] = seen.get(name, 0) + 1
    return out


def _row_axis(verify: tuple[int, ...], step: tuple[int, ...], width: int) -> int | None:
    """The axis holding the rows: ``width`` long in the verification's output, 1 long in a step's, the rest alike."""
    if len(verify) != len(step):
        return None
    for axis, (a, b) in enumerate(zip(verify, step)):
        if a == width and b == 1 and verify[:axis] + verify[axis + 1 :] == step[:axis] + step[axis + 1 :]:
            return axis
    return None


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")


def compare_traces(
    verify: list[tuple[str, mx.array]], steps: list[list[tuple[str, mx.array]]], width: int, length: int, level: str
) -> Divergence | None:
    """The first op, in the verification's order (an op's output recorded after its inner ops'), whose output
    differs from the serial steps' outputs of the same op joined; None when every op agrees."""
    serial = [dict(_keyed(step)) for step in steps]
    for key, got in _keyed(verify):
        parts = [step[key] for step in serial if key in step]
        if len(parts) != len(serial):
            continue
        axis = _row_axis(tuple(got.shape), tuple(parts[0].shape), width)
        if axis is None:
            continue
        a = np.array(got.astype(mx.float32))
        b = np.array(mx.concatenate(parts, axis=axis).astype(mx.float32))
        if np.array_equal(a, b):
            continue
        diff = np.moveaxis(np.abs(a - b), axis, 0).reshape(width, -1)
        diff = np.where(np.isnan(diff), np.inf, diff)
        row = int(np.argmax(diff.max(axis=1) > 0))
        found = _LAYER.search(key[0])
        layer, op = (int(found[1]), found[2]) if found else (None, key[0])
        return Divergence(layer, op, width, length, float(diff.max()), row, level)
    return None


def first_divergence(model: nn.Module, inputs: mx.array, cache: list[Any], plans: Plans, level: str) -> Divergence:
    """Replay a verification of ``inputs`` at ``plans`` and the serial steps of the same tokens from ``cache`` (as
    it is before the verification), op by op: the first op whose output differs. Leaves the caches as the serial
    steps leave them. Where no traced op differs (an op outside modules and attention), the logits are named."""
    width, length = inputs.shape[1], cache_length(cache)
    with split_mode(model, plans), _traced(model) as split:
        mx.eval(forward(model, inputs, cache))
    rewind(cache, width)
    with _traced(model) as steps:
        for i in range(width):
            serial_kv_layout(cache, 1)
            mx.eval(forward(model, inputs[:, i : i + 1], cache))
            steps.new_step()
    found = compare_traces(split.steps[0], steps.steps[:width], width, length, level)
    return found or Divergence(None, "logits", width, length, float("nan"), 0, level)
