"""An n-gram cache: next-token counts of every n-gram seen, kept across generations, drafted greedily.

llama.cpp's lookup decoding (``common/ngram-cache``) keeps such a cache: for every n-gram (n from ``min_ngram`` to
``max_ngram``) of every sequence the drafter has followed (prompts and generated tokens, this request's and every
earlier one's), how often each token came next. A draft extends the context one token at a time by the most
frequent successor of its longest cached tail (a draft token counts as context for the next), stopping where no
tail is cached or the best successor was seen fewer than ``min_count`` times.

Unlike prompt lookup (one request) and SuffixDecoding (whole continuations scored), one object learns from every
request it serves and drafts each token as the majority successor of a short context. At most ``max_ngrams``
n-grams are kept, the oldest forgotten first.
"""

from __future__ import annotations

from collections.abc import Sequence

from specbench.core.draft import Draft, Drafter
from specbench.core.policy_args import whole
from specbench.drafters.registry import DrafterInputs, register_drafter


class NgramCache(Drafter):
    """Draft each next token as the most frequent successor of the longest cached n-gram ending the context."""

    name = "ngram-cache"

    def __init__(self, min_ngram: int = 1, max_ngram: int = 4, min_count: int = 1, max_ngrams: int = 1_000_000):
        whole("min_ngram", min_ngram, 1)
        whole("max_ngram", max_ngram, min_ngram)
        whole("min_count", min_count, 1)
        whole("max_ngrams", max_ngrams, 1)
        self.min_ngram, self.max_ngram, self.min_count, self.max_ngrams = min_ngram, max_ngram, min_count, max_ngrams
        #: n-gram -> {next token: times seen}, oldest n-gram first; kept across requests.
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}
        self._tokens: list[int] = []  # the current request's context

    def begin(self, prompt: Sequence[int], hidden=None) -> None:
        self._tokens = []
        self.observe(prompt)

    def observe(self, tokens: Sequence[int], hidden=None) -> None:
        seq = self._tokens
        for token in tokens:
            token = int(token)
            for n in range(self.min_ngram, min(self.max_ngram, len(seq)) + 1):
                key = tuple(seq[-n:])
                successors = self.counts.get(key)
                if successors is None:
                    successors = self.counts[key] = {}
                    if len(self.counts) > self.max_ngrams:
                        del self.counts[next(iter(self.counts))]
                successors[token] = successors.get(token, 0) + 1
            seq.append(token)

    def _next(self, seq: list[int]) -> int | None:
        """The most frequent successor of the longest cached tail of ``seq`` (the first seen among equals)."""
        for n in range(min(self.max_ngram, len(seq)), self.min_ngram - 1, -1):
            successors = self.counts.get(tuple(seq[-n:]))
            if successors:
                token, count = max(successors.items(), key=lambda item: item[1])
                return token if count >= self.min_count else None
        return None

    def draft(self, context: Sequence[int], k: int) -> Draft:
        if len(context) != len(self._tokens):  # not followed from the start: learn the context now
            self.begin(context)
        seq = list(self._tokens)
        out: list[int] = []
        while len(out) < k:
            token = self._next(seq)
            if token is None:
                break
            out.append(token)
            seq.append(token)
        return Draft(out)


@register_drafter("ngram-cache", "next-token counts of every n-gram seen, kept across generations (llama.cpp's)")
def _ngram_cache(inputs: DrafterInputs) -> NgramCache:
    return NgramCache()
