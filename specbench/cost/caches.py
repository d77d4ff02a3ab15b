"""Prompt caches for timing: filled once with a context, put back after every timed forward."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from specbench.core.verify import CacheRollback


def prefill(model: nn.Module, tokens: Sequence[int], chunk: int = 512) -> list[Any]:
    """A fresh prompt cache of ``model`` holding ``tokens``."""
    cache = make_prompt_cache(model)
    for i in range(0, len(tokens), chunk):
        model(mx.array(tokens[i : i + chunk])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


class CacheRestore:
    """Puts caches back to where they were when this was made: trims key-value caches to their
    saved length and restores the saved arrays of recurrent ones."""

    def __init__(self, cache: list[Any]):
        self.cache = cache
        self.saved = [c.offset if c.is_trimmable() else (list(c.state[0]), *c.state[1:]) for c in cache]

    def __call__(self) -> None:
        for c, saved in zip(self.cache, self.saved):
            if isinstance(saved, int):
                c.trim(c.offset - saved)
            else:
                c.state = (list(saved[0]), *saved[1:])


def rollback_for(model: nn.Module, cache: list[Any]) -> CacheRollback | None:
    """The engine's cache rollback for these caches (it records recurrent layers during a
    verification, which changes what a hybrid model's verify computes), or None if it refuses."""
    try:
        return CacheRollback(cache, model)
    except ValueError:
        return None
