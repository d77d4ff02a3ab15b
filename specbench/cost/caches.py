"""Prompt caches for timing, put back after every timed forward (filled by ``specbench.core.forward.prefill``)."""

from __future__ import annotations

from typing import Any

import mlx.nn as nn

from specbench.core.verify import CacheRollback


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
