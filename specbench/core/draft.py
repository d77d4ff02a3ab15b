"""The drafter protocol: what every drafter implements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx


@dataclass
class Draft:
    """Tokens proposed for verification.

    ``probs`` holds the drafter's full distribution q for each proposed token, shape
    ``[len(tokens), vocab]``; ``None`` means the drafter is deterministic (q is one-hot).
    """

    tokens: list[int]
    probs: mx.array | None = None

    def __len__(self) -> int:
        return len(self.tokens)


class Drafter:
    """Base class of drafters.

    A drafter follows one request at a time: ``begin`` with the prompt, ``draft`` proposals,
    ``observe`` the tokens the model emitted, ``end`` when the request finishes.
    Drafters know nothing of policies; ``preferred_k`` is only their suggestion.
    """

    name: str = "drafter"
    #: When True the engine passes the model's hidden states (post final norm) to
    #: ``begin`` (prompt positions) and ``observe`` (one row per emitted token: the row
    #: whose output produced that token).
    needs_hidden: bool = False
    #: Draft length the drafter suggests to ``DraftPolicy.auto()``.
    preferred_k: int = 4
    #: Cost of drafting one token relative to one plain decode step, when known.
    cost_per_token: float = 0.0

    def begin(self, prompt: Sequence[int], hidden: mx.array | None = None) -> None:
        """Start a request with its prompt token ids."""

    def draft(self, context: Sequence[int], k: int) -> Draft | list[int]:
        """Propose up to ``k`` tokens continuing ``context`` (prompt + emitted tokens)."""
        raise NotImplementedError

    def observe(self, tokens: Sequence[int], hidden: mx.array | None = None) -> None:
        """Follow the context: ``tokens`` were just emitted (appended to the context)."""

    def end(self) -> None:
        """The request finished."""


def as_draft(proposal: Draft | Sequence[int] | None, k: int) -> Draft:
    """Normalise what ``Drafter.draft`` returned into a ``Draft`` of at most ``k`` tokens."""
    if proposal is None:
        return Draft([])
    if isinstance(proposal, Draft):
        if len(proposal.tokens) <= k:
            return proposal
        probs = proposal.probs[:k] if proposal.probs is not None else None
        return Draft(list(proposal.tokens[:k]), probs)
    return Draft([int(t) for t in list(proposal)[:k]])
