"""The drafter protocol: what every drafter implements."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from numbers import Integral

import mlx.core as mx

from specbench.core.tree import check_parents, check_siblings, is_path


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

    @property
    def is_tree(self) -> bool:
        return self.parents is not None


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


def as_draft(proposal: Draft | Sequence[int] | None, k: int, drafter: str = "drafter") -> Draft:
    """Normalise what ``Drafter.draft`` returned into a ``Draft`` of at most ``k`` tokens.

    q's rows stay paired with their tokens: truncation cuts both; a q whose row count does not
    match the tokens is kept whole, for ``check_draft`` to reject.
    """
    if proposal is None:
        return Draft([])
    if isinstance(proposal, Draft):
        tokens = _token_list(proposal.tokens, drafter)
        probs, parents, confidence = proposal.probs, proposal.parents, proposal.confidence
        if parents is not None:
            parents = _token_list(parents, drafter)
        if len(tokens) <= k:
            return Draft(tokens, probs, parents, confidence)
        if probs is not None and getattr(probs, "shape", (None,))[:1] == (len(tokens),):
            probs = probs[:k]
        if parents is not None and len(parents) == len(tokens):
            parents = parents[:k]  # parents come first: the first k nodes are a tree
        return Draft(tokens[:k], probs, parents, confidence[:k] if confidence is not None else None)
    return Draft(_token_list(proposal, drafter)[:k])


def cut_unconfident(draft: Draft, threshold: float) -> Draft:
    """``draft`` up to its first token whose drafter probability (``Draft.confidence``, else q at the token)
    is under ``threshold``; a draft without probabilities, or a tree, is kept whole."""
    if threshold <= 0 or not draft.tokens or draft.is_tree:
        return draft
    confidence = draft.confidence
    if confidence is None and draft.probs is not None:
        rows = mx.take_along_axis(draft.probs, mx.array(draft.tokens, dtype=mx.int32)[:, None], axis=-1)
        confidence = rows[:, 0].astype(mx.float32).tolist()
    if confidence is None:
        return draft
    n = next((i for i, p in enumerate(confidence) if p < threshold), len(draft.tokens))
    if n == len(draft.tokens):
        return draft
    probs = draft.probs[:n] if draft.probs is not None else None
    return Draft(draft.tokens[:n], probs, None, list(confidence[:n]))


def _token_list(tokens: object, drafter: str) -> list:
    """Drafted tokens as a list: None is none, an mx.array its values; anything not a sequence is an error."""
    if tokens is None:
        return []
    if isinstance(tokens, mx.array):
        return tokens.tolist() if tokens.ndim else [tokens.item()]
    if isinstance(tokens, (str, bytes, Mapping, Set)) or not isinstance(tokens, Iterable):
        raise TypeError(
            f"drafter {drafter} returned {tokens!r} ({type(tokens).__name__}): a draft is a Draft or an ordered "
            "sequence of token ids"
        )
    return list(tokens)


def check_draft(draft: Draft, drafter: str, vocab: int | None, sampling: bool) -> Draft:
    """``draft`` with its tokens as ints, or one clear error naming ``drafter`` and what was wrong.

    Token ids must be integers in [0, vocab). When ``sampling`` and the drafter gave q
    (``draft.probs``), q must be an mx.array of shape (len(tokens), vocab), finite, non-negative,
    each row summing to 1 (within ``Q_TOLERANCE``, more for 16-bit dtypes), and > 0 at each drafted
    token: the acceptance rule min(1, p/q) would otherwise accept drafts blindly. The q check is one
    evaluation of a few reductions.
    """
    tokens = list(draft.tokens)
    for t in tokens:
        if not isinstance(t, Integral) or isinstance(t, bool):
            raise TypeError(f"drafter {drafter} proposed {t!r} ({type(t).__name__}): token ids must be integers")
    tokens = [int(t) for t in tokens]
    bad = [t for t in tokens if t < 0 or (vocab is not None and t >= vocab)]
    if bad:
        allowed = f"[0, {vocab})" if vocab is not None else ">= 0"
        raise ValueError(f"drafter {drafter} proposed token ids {bad[:5]} outside {allowed}")
    parents = draft.parents
    if parents is not None:
        parents = check_parents(parents, len(tokens), drafter)
        check_siblings(tokens, parents, drafter)
        if is_path(parents):
            parents = None
    if sampling and draft.probs is not None and tokens:
        _check_q(draft.probs, tokens, drafter, vocab)
    return Draft(tokens, draft.probs, parents, draft.confidence)


#: How far a row of q may sum from 1 (relative), for 32-bit q; 16-bit q gets a few of its epsilons.
Q_TOLERANCE = 1e-3


def _check_q(q: object, tokens: list[int], drafter: str, vocab: int | None) -> None:
    if not isinstance(q, mx.array):
        raise TypeError(f"drafter {drafter} gave q (Draft.probs) as {type(q).__name__}: it must be an mx.array")
    width = vocab if vocab is not None else (q.shape[-1] if q.ndim else None)
    if q.shape != (len(tokens), width):
        raise ValueError(
            f"drafter {drafter} gave q (Draft.probs) of shape {tuple(q.shape)}: it must be (drafted tokens, vocab) = "
            f"({len(tokens)}, {width}), one row per drafted token"
        )
    if not mx.issubdtype(q.dtype, mx.floating):
        raise TypeError(f"drafter {drafter} gave q (Draft.probs) of dtype {q.dtype}: it must be floating point")
    rows = q.astype(mx.float32)
    at_draft = mx.take_along_axis(rows, mx.array(tokens, dtype=mx.int32)[:, None], axis=-1)[:, 0]
    sums = rows.sum(axis=-1)
    finite, smallest, smallest_at_draft = mx.all(mx.isfinite(rows)), rows.min(), at_draft.min()
    worst_sum = sums[mx.argmax(mx.abs(sums - 1.0))]
    mx.eval(finite, smallest, worst_sum, smallest_at_draft)
    if not finite.item():
        raise ValueError(f"drafter {drafter} gave q (Draft.probs) with NaN or infinite values")
    if smallest.item() < 0:
        raise ValueError(f"drafter {drafter} gave q (Draft.probs) with negative values (min {smallest.item():.3g})")
    tolerance = max(Q_TOLERANCE, 4 * float(mx.finfo(q.dtype).eps))
    if abs(worst_sum.item() - 1.0) > tolerance:
        raise ValueError(
            f"drafter {drafter} gave q (Draft.probs) whose rows do not sum to 1 (one sums to {worst_sum.item():.6g}; "
            f"tolerance {tolerance:.1e}): normalise q"
        )
    if smallest_at_draft.item() <= 0:
        raise ValueError(
            f"drafter {drafter} gave q (Draft.probs) = 0 at a token it drafted: q must be > 0 at each drafted token "
            "(the acceptance rule min(1, p/q) would accept it blindly)"
        )
