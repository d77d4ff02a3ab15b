"""Timed generations: one prefill of a prompt's prefix shared by its generations, the one clock every benchmark
times a generation by (``clocked``), and a prompt decoded plainly and speculatively side by side."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from specbench.common.timing import quiet
from specbench.core.draft import Drafter, within_max_draft, within_max_tokens
from specbench.core.engine import Generation, plain_generation
from specbench.core.forward import prefill
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.decoding import speculative_generate

G = TypeVar("G", bound=Iterable[Any])


def prefix_cache(model: Any, prompt_ids: Sequence[int], step: int = 512) -> list[Any] | None:
    """A prompt cache holding all but the last token of ``prompt_ids`` (None for a 1-token
    prompt), prefilled ``step`` tokens a forward (on the 2-core CPU the embedded model's 2,047 tokens took 21 s in
    512-token forwards against 39 s in one): generations of that prompt start from a copy (``cache_copy``) instead of
    a prefill."""
    return prefill(model, list(prompt_ids[:-1]), step) if len(prompt_ids) > 1 else None


def cache_copy(cache: list[Any] | None, drafter: Drafter | None = None) -> list[Any] | None:
    """A copy of a prefix cache for one generation (None where the drafter needs the prompt's
    hidden states, which only a full prefill yields)."""
    if cache is None or (drafter is not None and getattr(drafter, "needs_hidden", False)):
        return None
    return copy.deepcopy(cache)


@dataclass(frozen=True)
class Clocked(Generic[G]):
    """A generation run to the end by ``clocked``: ``run`` (what ``make`` returned), the ``items`` it yielded, and
    its seconds from the call that made it to its first item (``first_token_s``) and to its end (``wall_s``, what a
    caller waits); ``decode_s`` from its first item to its last. (The trace benchmark and policy confirmation time
    by a generation's ``decode_s`` stat instead: its logged decode steps' seconds, without the work between steps.)"""

    run: G
    items: list[Any]
    first_token_s: float
    decode_s: float
    wall_s: float


def clocked(make: Callable[[], G]) -> Clocked[G]:
    """``make()`` run to the end and timed (``Clocked``), the garbage collector collected before and paused during."""
    with quiet():
        start = time.perf_counter()
        run = make()
        items: list[Any] = []
        first = last = start
        for item in run:
            last = time.perf_counter()
            if not items:
                first = last
            items.append(item)
        end = time.perf_counter()
    return Clocked(run, items, first - start, last - first, end - start)


def timed_generation(
    model: Any,
    prompt: Sequence[int],
    options: GenerateOptions,
    drafter: Drafter | None = None,
    policy: DraftPolicy | None = None,
    tokenizer: Any = None,
    prompt_cache: list[Any] | None = None,
    profile: Any = None,
) -> Clocked[Generation]:
    """Plain decoding of ``prompt`` (no ``drafter``) or speculative decoding with ``drafter`` and ``policy``
    (``profile``: the cost profile Auto plans with), run to the end by ``clocked``."""
    if drafter is None:
        return clocked(lambda: plain_generation(model, prompt, options, tokenizer=tokenizer, prompt_cache=prompt_cache))
    return clocked(
        lambda: speculative_generate(
            model,
            prompt,
            options,
            drafter=drafter,
            policy=policy,
            tokenizer=tokenizer,
            prompt_cache=prompt_cache,
            profile=profile,
        )
    )


def exact_widths(pairs: Iterable[tuple[DraftPolicy, Drafter]], max_tokens: int) -> list[int]:
    """The widths to calibrate exact verification for before anything is timed (the first verification at a new
    width would otherwise carry the calibration): up to the longest draft any (policy, drafter) asks and the last
    token, within what a generation of ``max_tokens`` tokens drafts."""
    drafts = (within_max_tokens(within_max_draft(p.longest_draft(d), d), max_tokens) for p, d in pairs)
    return list(range(2, max(drafts, default=0) + 2))


def clock_stats(generation: Any, seconds: float) -> dict[str, Any]:
    """``generation.stats()`` with ``decode_s`` and ``decode_tokens_per_s`` by the clock (``seconds``)."""
    decode = len(generation.tokens) - 1
    return {**generation.stats(), "decode_s": seconds, "decode_tokens_per_s": decode / seconds if seconds > 0 else 0.0}


@dataclass
class SideBySide:
    """One prompt decoded plainly, then speculatively: both generations and their decode times."""

    plain: Any
    speculative: Any
    plain_s: float
    speculative_s: float

    @property
    def speedup(self) -> float:
        """Speculative decode tokens/s over plain's (NaN where either took no time)."""
        runs = ((self.plain, self.plain_s), (self.speculative, self.speculative_s))
        plain, spec = ((len(gen.tokens) - 1) / s if s > 0 else float("nan") for gen, s in runs)
        return spec / plain

    def stats(self) -> dict[str, Any]:
        """The speculative generation's stats, with decode time and speed by the clock."""
        return clock_stats(self.speculative, self.speculative_s)

    @property
    def equal(self) -> bool | None:
        """Outputs equal token for token (None when sampling: not expected)."""
        if self.plain.options.temperature != 0:
            return None
        return list(self.plain.tokens) == list(self.speculative.tokens)


def side_by_side(
    model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    options: GenerateOptions,
    drafter: Drafter,
    policy: DraftPolicy,
) -> SideBySide:
    """Decode ``prompt_ids`` plainly and then speculatively (same options), timing both."""
    plain = timed_generation(model, prompt_ids, options, tokenizer=tokenizer)
    spec = timed_generation(model, prompt_ids, options, drafter, policy, tokenizer)
    return SideBySide(plain.run, spec.run, plain.decode_s, spec.decode_s)
