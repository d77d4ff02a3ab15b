"""Speculative decoding in lockstep over the ranks of a sharded model.

Every rank runs the same decode loop on its shard; the sharded layers sum their outputs over the
group, so every rank sees the same logits and accepts the same tokens. What must also be the same
everywhere is what the loop decides from outside the model: the draft and the draft length.
``RankZeroDrafter`` and ``RankZeroPolicy`` make rank 0 decide and broadcast the decision, so
drafters and policies need not be deterministic (timings, random drafts, a store of their own).
In a world of one they call the wrapped object directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from specbench.common import distributed
from specbench.core.draft import Draft, Drafter
from specbench.core.log import StepLog
from specbench.core.policies import Decision, DraftPolicy
from specbench.core.verify import as_draft


class RankZeroDrafter(Drafter):
    """Rank 0's drafter, its drafts (tokens and q) broadcast to every rank; other ranks run none."""

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.name = getattr(inner, "name", "drafter")
        self.needs_hidden = bool(getattr(inner, "needs_hidden", False))
        self.preferred_k = getattr(inner, "preferred_k", 4)
        self.cost_per_token = getattr(inner, "cost_per_token", 0.0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)

    def begin(self, prompt: Sequence[int], hidden: mx.array | None = None) -> None:
        if distributed.is_main():
            self.inner.begin(prompt, hidden)

    def observe(self, tokens: Sequence[int], hidden: mx.array | None = None) -> None:
        if distributed.is_main():
            self.inner.observe(tokens, hidden)

    def end(self) -> None:
        if distributed.is_main():
            self.inner.end()

    def draft(self, context: Sequence[int], k: int) -> Draft:
        if not distributed.is_main():
            tokens, shape, dtype = _received(distributed.broadcast())
            probs = None if shape is None else distributed.broadcast_array(None, shape, getattr(mx, dtype))
            return Draft(tokens, probs)
        try:
            draft = as_draft(self.inner.draft(context, k), k, self.name)
        except Exception as err:
            distributed.broadcast(_Failure(f"drafter {self.name} failed on rank 0: {type(err).__name__}: {err}"))
            raise
        probs = draft.probs if isinstance(draft.probs, mx.array) else None
        shape, dtype = (tuple(probs.shape), str(probs.dtype).split(".")[-1]) if probs is not None else (None, None)
        distributed.broadcast((list(draft.tokens), shape, dtype))
        if probs is not None:
            distributed.broadcast_array(probs, shape, probs.dtype)
        return draft


class RankZeroPolicy(DraftPolicy):
    """Rank 0's policy, its decisions broadcast to every rank; other ranks' copy is not consulted."""

    def __init__(self, inner: DraftPolicy):
        self.inner = inner
        self.name = getattr(inner, "name", "policy")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)

    @property
    def needs_break_even(self) -> bool:
        return self.inner.needs_break_even

    def start(self, drafter: Drafter, break_even: Callable[[int], float] | None = None) -> None:
        if distributed.is_main():
            self.inner.start(drafter, break_even)

    def decide(self, log: StepLog, drafter: Drafter) -> Decision:
        return _decided_on_rank_zero(lambda: self.inner.decide(log, drafter), f"policy {self.name}")

    def longest_draft(self, drafter: Drafter | None) -> int:
        return self.inner.longest_draft(drafter)

    def set_batch_size(self, batch_size: int) -> None:
        self.inner.set_batch_size(batch_size)


def in_lockstep(drafter: Drafter | None, policy: DraftPolicy | None) -> tuple[Drafter | None, DraftPolicy | None]:
    """``drafter`` and ``policy`` (default ``DraftPolicy.auto()``) deciding on rank 0 for every rank
    of the global group; unchanged in a world of one or without a drafter."""
    if drafter is None or distributed.size() == 1:
        return drafter, policy
    if not isinstance(drafter, RankZeroDrafter):
        drafter = RankZeroDrafter(drafter)
    policy = policy or DraftPolicy.auto()
    if isinstance(policy, DraftPolicy) and not isinstance(policy, RankZeroPolicy):
        policy = RankZeroPolicy(policy)
    return drafter, policy


@dataclass
class _Failure:
    """What rank 0 broadcasts instead of a decision it failed to make: the other ranks raise it too."""

    message: str


def _received(value: Any) -> Any:
    if isinstance(value, _Failure):
        raise RuntimeError(value.message)
    return value


def _decided_on_rank_zero(decide: Callable[[], Decision], what: str) -> Decision:
    """``decide()`` on rank 0, broadcast; a failure there is raised on every rank."""
    if not distributed.is_main():
        return _received(distributed.broadcast())
    try:
        value = decide()
    except Exception as err:
        distributed.broadcast(_Failure(f"{what} failed on rank 0: {type(err).__name__}: {err}"))
        raise
    return distributed.broadcast(value)
