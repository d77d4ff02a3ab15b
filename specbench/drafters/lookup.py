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
        #: n-gram -> the positions right after its occurrences, oldest first (indexed once a token follows).
        self._starts: dict[tuple[int, ...], list[int]] = {}

    def begin(self, prompt: Sequence[int], hidden=None) -> None:
        self._tokens, self._starts = [], {}
        self.observe(prompt)

    def observe(self, tokens: Sequence[int], hidden=None) -> None:
        seq = self._tokens
        for t in tokens:
            end = len(seq)
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self._starts.setdefault(tuple(seq[end - n : end]), []).append(end)
            seq.append(int(t))

    def draft(self, context: Sequence[int], k: int) -> Draft:
        if len(context) != len(self._tokens):
            self.begin(context)
        seq = self._tokens
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            starts = self._starts.get(tuple(seq[-n:]))
            if starts and self.tree:
                return self._tree(starts, k)
            if starts:
                # The latest occurrence, unless it is too close to the end to fill the draft (then the first).
                start = starts[-1] if len(seq) - starts[-1] >= k else starts[0]
                return Draft(seq[start : start + k])
        return Draft([])

    def _tree(self, starts: list[int], k: int) -> Draft:
        """The continuations of the latest ``max_candidates`` distinct occurrences (``starts``), as a tree."""
        seq = self._tokens
        paths: list[list[int]] = []
        for start in reversed(starts):
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
