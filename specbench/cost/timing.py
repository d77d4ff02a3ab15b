"""Timing helpers shared by the cost measurements: prompt caches put back after every timed forward, seconds per
token of a generation, one timed verification forward, and a drafter whose drafts are rejected."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specbench.common.timing import quiet
from specbench.core.draft import Draft, Drafter
from specbench.core.engine import Generation, plain_generation
from specbench.core.forward import vocab_size
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.core.tree import tree_attention
from specbench.core.verify import FAST, CacheRollback, Verifier

T = TypeVar("T")


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


def kept_rounds(
    warmup: int, repeats: int, one_round: Callable[[], T], enough: Callable[[list[T]], bool] = lambda kept: False
) -> list[T]:
    """The results of ``repeats`` calls of ``one_round`` after ``warmup`` discarded ones; fewer once
    ``enough(kept)``, asked after every kept round (where a caller reports progress), says so."""
    for _ in range(warmup):
        one_round()
    kept: list[T] = []
    while len(kept) < repeats:
        kept.append(one_round())
        if enough(kept):
            break
    return kept


def seconds_per_token(generation: Iterable[int], excluded: Callable[[], float] = lambda: 0.0) -> float:
    """Iterate a generation; seconds per token after the first (the prompt pass excluded), less
    the growth of ``excluded()`` (seconds spent on bookkeeping that is not decoding); the garbage
    collector paused throughout (``quiet``)."""
    count, t_first, x_first = 0, 0.0, 0.0
    with quiet():
        for _ in generation:
            count += 1
            if count == 1:
                t_first, x_first = time.perf_counter(), excluded()
        end = time.perf_counter()
    if count < 2:
        raise ValueError("a timed generation needs at least 2 tokens: raise max_tokens")
    return (end - t_first - (excluded() - x_first)) / (count - 1)


def time_plain(model: nn.Module, cache: list[Any], first: int, n: int, restore: CacheRestore) -> float:
    """Seconds per token of ``n`` plain greedy steps through the engine (pipelined as mlx-lm
    decodes) after the cached context."""
    options = GenerateOptions(max_tokens=n + 1, ignore_eos=True)
    seconds = seconds_per_token(plain_generation(model, [first], options, prompt_cache=cache))
    restore()
    return seconds


def time_verify(
    verifier: Verifier,
    model: nn.Module,
    cache: list[Any],
    tokens: mx.array,
    restore: CacheRestore,
    rollback: CacheRollback | None = None,
    parents: Sequence[int] | None = None,
) -> float:
    """Seconds of one width-w forward with the greedy targets read back, as the engine verifies; with ``parents``,
    of a token tree's rows under its mask (``specbench.core.tree``)."""
    if rollback is not None:
        rollback.before_verify(tokens.shape[1])
    mx.synchronize()
    with contextlib.nullcontext() if parents is None else tree_attention(model, cache, parents):
        t0 = time.perf_counter()
        logits = verifier.forward(model, tokens, cache)
        verifier.greedy(logits[0])
        seconds = time.perf_counter() - t0
    if rollback is not None:
        rollback.rewind(0)
    restore()
    return seconds


class RandomDrafter(Drafter):
    """Proposes uniformly random tokens: nearly every draft is rejected, so each engine step
    verifies the full width and emits one token."""

    name = "random"

    def __init__(self, vocab: int, seed: int = 0):
        self.vocab = vocab
        self.rng = np.random.default_rng(seed)

    def draft(self, context: Sequence[int], k: int) -> Draft:
        return Draft(self.rng.integers(0, self.vocab, size=k).tolist())


def rejected_drafts(
    model: nn.Module, cache: list[Any], first: int, width: int, max_tokens: int, verifier: Verifier = FAST
) -> Generation:
    """A generation of ``max_tokens`` from token ``first`` over ``cache`` whose steps verify ``width`` rows:
    random drafts of ``width - 1`` tokens (``RandomDrafter``, ``DraftPolicy.fixed``), nearly all rejected,
    verified by ``verifier``."""
    options = GenerateOptions(max_tokens=max_tokens, ignore_eos=True, verify=verifier.mode)
    return Generation(
        model,
        [first],
        options,
        drafter=RandomDrafter(vocab_size(model)),
        policy=DraftPolicy.fixed(width - 1),
        prompt_cache=cache,
        verifier=verifier,
    )
