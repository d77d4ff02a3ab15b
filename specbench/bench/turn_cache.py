"""Prompt caches kept across a conversation's turns: the next turn's prompt extends the last one, so
a method prefills only its new tokens.

Only the previous prompt's tokens are reused (the reply's are prefilled again with the new
messages): every method then holds the same cache contents for the same prompt, however its reply
was verified, so methods stay comparable token for token on every device. When the chat template
renders the history differently from the turn before, the cache is trimmed to the prefix the two
prompts share; with nothing shared (or a cache that cannot be trimmed) the turn is a full prefill.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(differ[0]) if len(differ) else n


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two token sequences differ (None: equal; a prefix of the other differs at its
    end)."""
    return None if list(a) == list(b) else common_prefix(a, b)


def reply_text(tokenizer: Any, tokens: Sequence[int], stop_ids: set[int]) -> str:
    """A reply as the next turn's history holds it: its text without its trailing stop tokens."""
    tokens = list(tokens)
    while tokens and tokens[-1] in stop_ids:
        tokens.pop()
    return tokenizer.decode(tokens)


class TurnCache:
    """One method's prompt cache across turns: ``take(prompt)`` before a turn (the cache to pass as
    ``prompt_cache``, or None for a full prefill), ``keep(prompt, cache)`` after it."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.cache: list[Any] | None = None
        self.prompt: list[int] = []

    def take(self, prompt: Sequence[int]) -> list[Any] | None:
        cache, self.cache = self.cache, None
        if cache is None or not self.enabled:
            return None
        reuse = min(common_prefix(self.prompt, prompt), len(prompt) - 1)
        offset = getattr(cache[0], "offset", None) if cache else None
        if reuse <= 0 or not isinstance(offset, int) or offset < reuse:
            return None
        if offset > reuse:
            if not can_trim_prompt_cache(cache):
                return None
            trim_prompt_cache(cache, offset - reuse)
        return cache

    def keep(self, prompt: Sequence[int], cache: list[Any] | None) -> None:
        self.prompt = list(prompt)
        self.cache = cache if self.enabled else None
