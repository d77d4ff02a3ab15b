"""Batch caches for attention-only and hybrid models, with a rollback per row.

Row r of a hybrid model's recurrent layers is left in the state after its own last kept position (its padding
runs after them, so it never reaches it).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, BatchKVCache, KVCache, make_prompt_cache

from specbench.core.rollback import RecurrentRecorder


def recurrent_layers(caches: list[Any]) -> list[int]:
    """Indices of the layers whose cache is recurrent state (``ArraysCache``)."""
    return [i for i, c in enumerate(caches) if isinstance(c, ArraysCache)]


def check_batchable(model: nn.Module) -> None:
    """One clear error, before any model work, when the model's caches cannot be batched with a
    rollback per row (supported: ``KVCache`` layers, and Gated DeltaNet layers in ``ArraysCache``)."""
    caches = make_prompt_cache(model)
    kinds = {type(c).__name__ for c in caches if type(c) not in (KVCache, ArraysCache)}
    if kinds:
        raise ValueError(
            f"batched decoding needs mlx-lm KVCache layers (and Gated DeltaNet layers in ArraysCache), but "
            f"this model uses {', '.join(sorted(kinds))}: decode its requests one at a time (speculative_generate)"
        )
    recurrent = recurrent_layers(caches)
    if recurrent:
        try:
            RecurrentRecorder(model, caches, recurrent)
        except ValueError as err:
            raise ValueError(
                f"batched decoding: {err}; decode its requests one at a time (speculative_generate)"
            ) from None


def batch_layer(cache: Any) -> Any:
    """One request's cache layer (after its prompt pass) as a batch layer of one row."""
    if isinstance(cache, ArraysCache):
        return ArraysCache.merge([cache])
    return BatchKVCache.merge([cache])


def empty_batch_caches(model: nn.Module, batch_size: int) -> list[Any]:
    """Empty batch caches for ``batch_size`` rows of equal length."""
    return [
        ArraysCache(len(c.cache)) if isinstance(c, ArraysCache) else BatchKVCache([0] * batch_size)
        for c in make_prompt_cache(model)
    ]


class RowRollback:
    """Rolls a batch cache back row by row after a verification: ``arm(width)`` before the [B, width]
    forward, ``rewind(kept)`` after it (``kept[r]``: the positions row r keeps, 1..width)."""

    def __init__(self, model: nn.Module, cache: list[Any]):
        self.cache = cache
        recurrent = recurrent_layers(cache)
        self.recorder = RecurrentRecorder(model, cache, recurrent) if recurrent else None
        self.width = 0

    def arm(self, width: int) -> None:
        self.width = width
        if self.recorder is not None and width > 1:
            self.recorder.arm(width)

    def rewind(self, kept: list[int]) -> None:
        """Drop each row's rejected tail: attention layers trim what every row drops and roll the
        rest of each row into its left padding; recurrent layers take each row's recorded state."""
        width, self.width = self.width, 0
        if width <= 1:
            return
        if self.recorder is not None:
            self._restore_rows(kept, width)
        right_padding = [width - n for n in kept]
        common = min(right_padding)
        rest = [p - common for p in right_padding]
        for layer in self.cache:
            if not layer.is_trimmable():
                continue
            if common:
                layer.trim(common)
            if max(rest) > 0:
                layer.prepare(right_padding=rest)
                layer.finalize()

    def _restore_rows(self, kept: list[int], width: int) -> None:
        recorder = self.recorder
        try:
            if min(kept) < width:
                steps = mx.array([n - 1 for n in kept])
                rows = mx.arange(len(kept))
                for i in recorder.mixers:
                    record = recorder.recorded(i, width)
                    self.cache[i][0] = mx.contiguous(mx.stack(record["conv"])[steps, rows])
                    self.cache[i][1] = mx.stack(record["states"])[steps, rows]
        finally:
            recorder.restore(0)  # stops recording


__all__ = ["RowRollback", "batch_layer", "check_batchable", "empty_batch_caches", "recurrent_layers"]
