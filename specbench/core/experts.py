"""MoE instrumentation: distinct experts a forward pass touches, per MoE layer.

A verification of w tokens in an MoE model reads the weights of every expert any of its
rows routes to. ``ExpertCounter`` counts what the model actually touched (the engine records it
per step when asked; ``specbench.cost.bandwidth`` compares it with uniform routing).

Counting is opt-in: nothing is changed in the model until ``ExpertCounter(model)`` is
entered, and leaving it restores the model exactly.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.switch_layers import SwitchGLU, SwitchMLP

from specbench.core.swap import restore_class, swap_class

EXPERT_LAYERS = (SwitchGLU, SwitchMLP)


def expert_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's expert blocks (mlx-lm's SwitchGLU / SwitchMLP), in layer order."""
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, EXPERT_LAYERS)]
    return sorted(found, key=lambda item: [int(p) if p.isdigit() else p for p in item[0].split(".")])


class _CountingExperts:
    """Mixed in front of an expert block while counting: its call records the routed expert indices."""

    def __call__(self, x, indices, *args, **kwargs):
        self._specbench_counter._record(self, indices)
        return super().__call__(x, indices, *args, **kwargs)


class ExpertCounter:
    """Counts the distinct experts each MoE layer routes to, between calls to ``take()``.

    ``with ExpertCounter(model) as counter:`` then, after each forward (verification),
    ``counter.take()`` returns one count per MoE layer and starts a new window. Several calls
    of one layer in a window (row-by-row exact verification) are counted together.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.layers = [m for _, m in expert_layers(model)]
        if not self.layers:
            raise ValueError("the model has no MoE expert layers (SwitchGLU / SwitchMLP) to count")
        self._seen: dict[int, list[mx.array]] = {}
        self._counting = False

    def __enter__(self) -> ExpertCounter:
        if self._counting:
            raise RuntimeError("this ExpertCounter is already counting")
        self._counting = True
        for layer in self.layers:
            swap_class(layer, _CountingExperts, _specbench_counter=self)
        return self

    def __exit__(self, *exc: Any) -> None:
        for layer in self.layers:
            restore_class(layer, "_specbench_counter")
        self._counting = False
        self._seen = {}

    def _record(self, layer: nn.Module, indices: mx.array) -> None:
        self._seen.setdefault(id(layer), []).append(indices)

    def take(self) -> list[int]:
        """Distinct experts per MoE layer since the last ``take`` (0 for layers not called)."""
        seen, self._seen = self._seen, {}
        calls = [seen.get(id(layer)) for layer in self.layers]
        return [int(np.unique(np.array(mx.concatenate([p.reshape(-1) for p in c]))).size) if c else 0 for c in calls]


def count_experts(model: nn.Module, inputs: mx.array, cache: list[Any] | None = None) -> list[int]:
    """Distinct experts per MoE layer touched by one forward of ``inputs`` ([1, w] ids)."""
    with ExpertCounter(model) as counter:
        mx.eval(model(inputs, cache=cache))
        return counter.take()
