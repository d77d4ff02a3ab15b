"""Controlled-acceptance drafters for cost studies: ``Oracle`` (a path), ``OracleTree`` (a tree of them).

It proposes the model's own greedy continuation (recorded from a plain run) and corrupts each
draft position independently with probability 1 - a (seeded). Under greedy verification every
position is then accepted with probability a given the earlier ones were, so measured speedups
can be set against the break-even model's prediction at a known acceptance.

A fast verify that is not bit-exact (GPUs) can flip a near-tie and leave the recorded
continuation. A drafter built with ``from_model(..., follow=True)`` then records the model's
plain greedy continuation of the new context and goes on; the time that takes is kept in
``follow_s`` so that timings can leave it out. A drafter built with ``keep_drafting=True`` (and no
model) never runs the model: after a divergence it goes on drafting its recording at the same output
position, and the acceptance it measures drops.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from specbench.core.draft import Draft, Drafter
from specbench.core.engine import plain_generation
from specbench.core.forward import vocab_size
from specbench.core.options import GenerateOptions
from specbench.core.policy_args import MAX_DRAFT_LENGTH, real, whole
from specbench.core.tree import breadth_first_tree


class Oracle(Drafter):
    """Draft the known greedy continuation of ``prompt``, each token kept with probability ``acceptance`` (else a
    different id drawn uniformly). ``recorded`` is the plain run's continuation, ``continuation`` the one being
    followed; ``diverged_at`` the first output position where the emitted output left it (see the module)."""

    name = "oracle"

    def __init__(
        self,
        prompt: Sequence[int],
        continuation: Sequence[int],
        acceptance: float,
        vocab_size: int,
        seed: int = 0,
        preferred_k: int = 4,
        model: Any = None,
        keep_drafting: bool = False,
    ):
        self.acceptance = acceptance
        whole("vocab_size", vocab_size, 2)
        whole("preferred_k", preferred_k, 1, MAX_DRAFT_LENGTH)
        if not continuation:
            raise ValueError("the continuation is empty: record at least one token from a plain run")
        self.prompt = [int(t) for t in prompt]
        self.recorded = [int(t) for t in continuation]  # begin() follows a copy
        self.vocab_size = int(vocab_size)
        self.seed = seed
        self.preferred_k = preferred_k
        self.model = model
        self.keep_drafting = keep_drafting
        self.begin(self.prompt)

    @property
    def acceptance(self) -> float:
        """The probability that each draft position is kept; set again between runs (a grid's cells), checked."""
        return self._acceptance

    @acceptance.setter
    def acceptance(self, value: float) -> None:
        self._acceptance = real("acceptance", value, 0.0, 1.0)

    @classmethod
    def from_model(
        cls,
        model: Any,
        prompt: Sequence[int],
        max_tokens: int,
        acceptance: float,
        seed: int = 0,
        follow: bool = False,
        **kwargs: Any,
    ) -> Oracle:
        """Record ``max_tokens`` of the model's plain greedy continuation of ``prompt``; with
        ``follow``, re-record it whenever the emitted output leaves it."""
        continuation = _greedy_continuation(model, prompt, max_tokens)
        return cls(prompt, continuation, acceptance, vocab_size(model), seed, model=model if follow else None, **kwargs)

    def begin(self, prompt: Sequence[int], hidden: Any = None) -> None:
        if list(prompt) != self.prompt:
            raise ValueError("Oracle was recorded for another prompt: build one per prompt")
        self.rng = np.random.default_rng(self.seed)
        self.continuation = list(self.recorded)
        self.position = 0
        self.diverged_at: int | None = None
        self.stale = False
        self.follows = 0
        self.follow_s = 0.0

    def observe(self, tokens: Sequence[int], hidden: Any = None) -> None:
        for t in tokens:
            p = self.position
            if not self.stale and p < len(self.continuation) and self.continuation[p] != int(t):
                self.stale = True
                if self.diverged_at is None:
                    self.diverged_at = p
            self.position += 1

    def draft(self, context: Sequence[int], k: int) -> Draft:
        start = len(context) - len(self.prompt)
        if self.stale and self.model is None and not self.keep_drafting:
            return Draft([])
        if self.model is not None and start < len(self.recorded) and (self.stale or start + k > len(self.continuation)):
            # Record the next stretch of the model's greedy output from here (a few drafts' worth:
            # after a divergence another one may follow soon).
            t0 = time.perf_counter()
            emitted = list(context[len(self.prompt) :])
            more = min(len(self.recorded) - start, 2 * k + 8)
            self.continuation = emitted + _greedy_continuation(self.model, context, more)
            self.stale = False
            self.follows += 1
            self.follow_s += time.perf_counter() - t0
        truth = self.continuation[start : start + k]
        keep = self.rng.random(len(truth)) < self.acceptance
        shift = self.rng.integers(1, self.vocab_size, size=len(truth))
        return Draft([t if ok else (t + int(s)) % self.vocab_size for t, ok, s in zip(truth, keep, shift)])


def _greedy_continuation(model: Any, prompt: Sequence[int], max_tokens: int) -> list[int]:
    return list(plain_generation(model, list(prompt), GenerateOptions(max_tokens=max_tokens, ignore_eos=True)))


class OracleTree(Drafter):
    """A tree of ``Oracle`` drafts of the same continuation (independent corruptions, each at most ``depth``
    tokens), merged level by level (``breadth_first_tree``) up to the step's node budget."""

    name = "oracle-tree"

    def __init__(self, oracles: Sequence[Oracle], depth: int):
        self.oracles, self.depth = list(oracles), depth

    def begin(self, prompt: Sequence[int], hidden: Any = None) -> None:
        for oracle in self.oracles:
            oracle.begin(prompt)

    def observe(self, tokens: Sequence[int], hidden: Any = None) -> None:
        for oracle in self.oracles:
            oracle.observe(tokens)

    def draft(self, context: Sequence[int], k: int) -> Draft:
        paths = [oracle.draft(context, min(self.depth, k)).tokens for oracle in self.oracles]
        tokens, parents = breadth_first_tree([p for p in paths if p], k)
        return Draft(tokens, parents=parents)
