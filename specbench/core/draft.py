"""The drafter protocol: what every drafter implements, and the ``Draft`` it proposes (checked before it is
verified: ``specbench.core.verify.as_draft`` and ``check_draft``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx


@dataclass
class Draft:
    """Tokens proposed for verification: a path, or a tree when ``parents`` is given.

    ``probs`` holds the drafter's full distribution q for each proposed token, shape
    ``[len(tokens), vocab]``; ``None`` means the drafter is deterministic (q is one-hot).
    ``parents`` (optional) makes the draft a token tree: node i's parent index, -1 for a child of
    the last emitted token, else an earlier node (``specbench.core.tree``); None is a path. In a
    tree, siblings carry distinct tokens, and a node's q is the distribution its token was drawn
    from given its earlier siblings (for siblings drawn without replacement: q with the earlier
    siblings' tokens removed, renormalised), which keeps tree sampling lossless.
    ``confidence`` (optional): the drafter's probability of each drafted token when it drafts greedily
    (q's row is then not kept); with neither, the drafter gave no probability.
    """

    tokens: list[int]
    probs: mx.array | None = None
    parents: list[int] | None = None
    confidence: list[float] | None = None

    def __len__(self) -> int:
        return len(self.tokens)


def within_max_draft(longest: int, drafter: Drafter) -> int:
    """``longest`` draft tokens, or fewer where ``drafter`` never drafts more (``Drafter.max_draft``)."""
    cap = getattr(drafter, "max_draft", None)
    return min(int(longest), int(cap)) if cap else int(longest)


def within_max_tokens(longest: int, max_tokens: int) -> int:
    """``longest`` draft tokens, or fewer where a generation of ``max_tokens`` tokens never drafts more: the engine
    drafts at most the tokens left but one (the verification emits one of its own), so at most ``max_tokens - 1``."""
    return max(0, min(int(longest), int(max_tokens) - 1))


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
    #: The most tokens one draft of this drafter holds, whatever a policy asks (None: as many as asked). A
    #: verification is never wider than this plus one, so exact mode calibrates no wider.
    max_draft: int | None = None
    #: Cost of drafting one token relative to one plain decode step, when known.
    cost_per_token: float = 0.0
    #: Whether its drafts carry q (``Draft.probs``: tokens sampled from it), which the acceptance rules "token" and
    #: "block" cannot verify into plain sampling's tokens when sampling by position: checked before any model work.
    sampled_drafts: bool = False

    def begin(self, prompt: Sequence[int], hidden: mx.array | None = None) -> None:
        """Start a request with its prompt token ids."""

    def draft(self, context: Sequence[int], k: int) -> Draft | list[int]:
        """Propose up to ``k`` tokens continuing ``context`` (prompt + emitted tokens)."""
        raise NotImplementedError

    def observe(self, tokens: Sequence[int], hidden: mx.array | None = None) -> None:
        """Follow the context: ``tokens`` were just emitted (appended to the context)."""

    def end(self) -> None:
        """The request finished."""
