"""Prompt lookup: draft the continuation of the latest earlier occurrence of the context's tail.

The n-gram method of prompt-lookup decoding and vLLM's ngram proposer: find the longest
n-gram (``max_ngram`` down to ``min_ngram``) ending the context that occurred before, and
propose the tokens that followed its latest occurrence (or its first, when the latest is too
close to the end to fill the draft). An index of n-gram positions is kept incrementally, so
a draft costs O(max_ngram) dictionary lookups.
"""

from __future__ import annotations

from collections.abc import Sequence

from specbench.core.draft import Draft, Drafter


class PromptLookup(Drafter):
    """Draft by matching the context's last n tokens against earlier ones (prompt and output)."""

    name = "lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, preferred_k: int = 4):
        if min_ngram < 1 or max_ngram < min_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.preferred_k = preferred_k
        self._tokens: list[int] = []
        self._latest: dict[tuple[int, ...], int] = {}
        self._first: dict[tuple[int, ...], int] = {}

    def begin(self, prompt: Sequence[int], hidden=None) -> None:
        self._tokens = []
        self._latest = {}
        self._first = {}
        self._extend(prompt)

    def observe(self, tokens: Sequence[int], hidden=None) -> None:
        self._extend(tokens)

    def _extend(self, tokens: Sequence[int]) -> None:
        # Index each n-gram by the position right after it, once a token follows it.
        seq = self._tokens
        for t in tokens:
            end = len(seq)
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end >= n:
                    key = tuple(seq[end - n : end])
                    self._latest[key] = end
                    self._first.setdefault(key, end)
            seq.append(int(t))

    def draft(self, context: Sequence[int], k: int) -> Draft:
        if len(context) != len(self._tokens):
            self.begin(context)
        seq = self._tokens
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            key = tuple(seq[-n:])
            start = self._latest.get(key)
            if start is not None:
                # The latest occurrence, unless it is too close to the end to fill the draft.
                if len(seq) - start < k:
                    start = min(start, self._first[key])
                return Draft(seq[start : start + k])
        return Draft([])
