"""Prompt lookup: draft the continuation of the latest earlier occurrence of the context's tail.

The n-gram method of prompt-lookup decoding and vLLM's ngram proposer: the tokens that followed the latest
earlier occurrence (or the first, when the latest is too close to the end to fill the draft) of the longest n-gram
(``max_ngram`` down to ``min_ngram``) ending the context. With ``tree=True`` the draft is a tree of the
continuations of the latest ``max_candidates`` distinct occurrences, so one verification tries them all.
"""

from __future__ import annotations

from collections.abc import Sequence

from specbench.core.draft import Draft, Drafter
from specbench.core.policy_args import MAX_DRAFT_LENGTH, whole
from specbench.core.tree import breadth_first_tree
from specbench.drafters.registry import DrafterInputs, register_drafter


class PromptLookup(Drafter):
    """Draft by matching the context's last n tokens against earlier ones (prompt and output)."""

    name = "lookup"

    def __init__(
        self,
        max_ngram: int = 3,
        min_ngram: int = 1,
        preferred_k: int = 4,
        tree: bool = False,
        max_candidates: int = 4,
    ):
        whole("max_ngram", max_ngram, 1)
        whole("min_ngram", min_ngram, 1)
        whole("max_candidates", max_candidates, 1)
        whole("preferred_k", preferred_k, 1, MAX_DRAFT_LENGTH)
        if max_ngram < min_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.preferred_k = preferred_k
        self.tree = bool(tree)
        self.max_candidates = max_candidates
        if self.tree:
            self.name = "lookup-tree"
        self._tokens: list[int] = []
        self._latest: dict[tuple[int, ...], int] = {}
        self._first: dict[tuple[int, ...], int] = {}
        self._all: dict[tuple[int, ...], list[int]] = {}

    def begin(self, prompt: Sequence[int], hidden=None) -> None:
        self._tokens = []
        self._latest = {}
        self._first = {}
        self._all = {}
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
                    if self.tree:
                        self._all.setdefault(key, []).append(end)
            seq.append(int(t))

    def draft(self, context: Sequence[int], k: int) -> Draft:
        if len(context) != len(self._tokens):
            self.begin(context)
        seq = self._tokens
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            key = tuple(seq[-n:])
            start = self._latest.get(key)
            if start is not None and self.tree:
                return self._tree(key, k)
            if start is not None:
                # The latest occurrence, unless it is too close to the end to fill the draft.
                if len(seq) - start < k:
                    start = min(start, self._first[key])
                return Draft(seq[start : start + k])
        return Draft([])

    def _tree(self, key: tuple[int, ...], k: int) -> Draft:
        """The continuations of the latest ``max_candidates`` distinct occurrences of ``key``, as a tree."""
        seq = self._tokens
        paths: list[list[int]] = []
        for start in reversed(self._all[key]):
            path = seq[start : start + k]
            if path and path not in paths:
                paths.append(path)
                if len(paths) == self.max_candidates:
                    break
        tokens, parents = breadth_first_tree(paths, k)
        return Draft(tokens, parents=parents)


@register_drafter("lookup", "prompt lookup: the continuation of the context's tail's latest earlier occurrence")
def _lookup(inputs: DrafterInputs) -> PromptLookup:
    return PromptLookup()
