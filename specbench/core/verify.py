"""One verification, from a drafter's proposal to the caches rolled back past its rejected tokens.

What the loop (``specbench.core.engine``) and the model target (``specbench.core.target``) run at every step, in
the order they run it: the proposal as a checked ``Draft``; the forward over the last token and the draft, through
the generation's verifier (``Verifier``: the fast mode, one batched forward; the exact mode,
``specbench.exact.ExactVerifier``, computes every row as serial decoding would); the greedy rule, for paths and
token trees (sampling's rules: ``specbench.core.accept`` and ``specbench.core.rules``); the rollback of the caches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from numbers import Integral
from typing import Any, Literal, get_args

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache

from specbench.core.draft import Draft
from specbench.core.forward import logits_from_hidden, text_model
from specbench.core.rollback import RecurrentRecorder
from specbench.core.tree import check_parents, check_siblings, children, is_path

#: "exact": every verified row computed as serial decoding computes it; "fast": one batched forward.
VerifyMode = Literal["exact", "fast"]
VERIFY_MODES: tuple[VerifyMode, ...] = get_args(VerifyMode)


def check_verify_mode(mode: object) -> VerifyMode:
    """``mode`` if it is a verify mode, else one clear ValueError."""
    if not isinstance(mode, str) or mode not in VERIFY_MODES:
        raise ValueError(f"verify mode must be one of {', '.join(VERIFY_MODES)}, got {mode!r}")
    return mode  # type: ignore[return-value]


# -- the draft -------------------------------------------------------------------------------------------------------


def as_draft(proposal: Draft | Sequence[int] | None, k: int, drafter: str = "drafter") -> Draft:
    """Normalise what ``Drafter.draft`` returned into a ``Draft`` of at most ``k`` tokens.

    q's rows stay paired with their tokens: truncation cuts both; a q whose row count does not
    match the tokens is kept whole, for ``check_draft`` to reject. ``Draft.confidence`` must hold one
    probability in [0, 1] per drafted token (a confidence threshold cuts the draft by it), else one clear error.
    """
    if proposal is None:
        return Draft([])
    if isinstance(proposal, Draft):
        tokens = _token_list(proposal.tokens, drafter)
        probs, parents, confidence = proposal.probs, proposal.parents, proposal.confidence
        if confidence is not None:
            confidence = _confidence(confidence, len(tokens), drafter)
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
    if threshold <= 0 or not draft.tokens or draft.parents is not None:
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


def _confidence(values: object, drafted: int, drafter: str) -> list[float]:
    """``Draft.confidence`` as floats: one probability in [0, 1] per drafted token, else one clear error naming
    ``drafter`` (a NaN, a value out of range or a missing one would let an unconfident token through)."""
    what = f"drafter {drafter} gave confidence (Draft.confidence)"
    if isinstance(values, mx.array):
        values = values.tolist() if values.ndim else [values.item()]
    if isinstance(values, (str, bytes, Mapping, Set)) or not isinstance(values, Iterable):
        raise TypeError(
            f"{what} as {type(values).__name__}: it must be a sequence of one probability per drafted token"
        )
    values = list(values)
    if len(values) != drafted:
        raise ValueError(
            f"{what} of {len(values)} values for {drafted} drafted tokens: it must hold one probability per token"
        )
    out = []
    for i, value in enumerate(values):
        try:
            if isinstance(value, (bool, str, bytes)):
                raise TypeError
            p = float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"{what} with {value!r} ({type(value).__name__}) at token {i}: it must be a number"
            ) from None
        if not 0.0 <= p <= 1.0:  # NaN fails too
            raise ValueError(f"{what} with {value!r} at token {i}: it must be a probability in [0, 1]")
        out.append(p)
    return out


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
    """``draft`` with its tokens as ints in [0, vocab) and its tree checked, or one clear error naming ``drafter``;
    when ``sampling``, q (``draft.probs``) must be a distribution per drafted token, > 0 at it (``_check_q``)."""
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
    """q an mx.array [len(tokens), vocab], finite, non-negative, rows summing to 1, > 0 at each drafted token (the
    rule min(1, p/q) would otherwise accept drafts blindly): one evaluation of a few reductions."""
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


# -- the forward -----------------------------------------------------------------------------------------------------


def forward(
    model: nn.Module, inputs: mx.array, cache: list[Any], return_hidden: bool = False
) -> mx.array | tuple[mx.array, mx.array]:
    """Logits [1, w, vocab] of ``inputs`` ([1, w] ids), extending ``cache``; with ``return_hidden`` also the
    post-final-norm states [1, w, hidden]."""
    if not return_hidden:
        return model(inputs, cache=cache)
    lm = text_model(model)
    hidden = lm.model(inputs, cache=cache)
    return logits_from_hidden(model, hidden), hidden


def greedy(logits: mx.array) -> mx.array:
    """Argmax of log-probabilities over the last axis, as mlx-lm's greedy sampler computes it."""
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return mx.argmax(logprobs, axis=-1)


class Verifier:
    """Fast verification: one batched forward over the drafted tokens."""

    mode: VerifyMode = "fast"

    def prepare(
        self, widths: Sequence[int], progress: Callable[[str], None] | None = None, context: int | None = None
    ) -> list[int]:
        """Before a generation verifying ``widths`` with caches of up to ``context`` tokens: what the verifier
        measures once (none here); returns the widths it measured."""
        return []

    def running(self) -> contextlib.AbstractContextManager[None]:
        """Around one speculative generation (what the verifier prepares once per generation)."""
        return contextlib.nullcontext()

    def decoding(self) -> contextlib.AbstractContextManager[None]:
        """Around every generation, plain or speculative: how its plain steps run (the model's own calls here)."""
        return contextlib.nullcontext()

    def forward(
        self, model: nn.Module, inputs: mx.array, cache: list[Any], return_hidden: bool = False
    ) -> mx.array | tuple[mx.array, mx.array]:
        """The verification forward of ``inputs`` ([1, w] ids), extending ``cache``."""
        return forward(model, inputs, cache, return_hidden)

    def greedy(self, logits: mx.array) -> list[int]:
        """The model's greedy choice at each row of ``logits`` ([w, vocab])."""
        return greedy(logits).tolist()

    def before_plain_step(self, cache: list[Any]) -> None:
        """Called before each plain decode step of a speculative generation."""

    def after_rewind(self, cache: list[Any], rejected: int) -> None:
        """Called after the caches dropped the ``rejected`` tokens of a verification."""

    def audit_result(self) -> Any:
        """What the last generation's audit found (``specbench.exact.audit.AuditResult``), None where none ran."""
        return None


#: The fast verifier (stateless: one instance serves every generation).
FAST = Verifier()


# -- the greedy rule -------------------------------------------------------------------------------------------------


def accept_greedy(draft: list[int], targets: list[int]) -> tuple[int, list[int]]:
    """Greedy rule: the longest prefix of ``draft`` equal to ``targets`` (the argmax per row, the bonus row last):
    (accepted count, emitted tokens: the accepted drafts, then the model's own token)."""
    if len(targets) != len(draft) + 1:
        raise ValueError(
            f"the greedy rule takes one target per drafted token and the bonus one: {len(draft) + 1} for a draft of "
            f"{len(draft)}, got {len(targets)}"
        )
    n = 0
    while n < len(draft) and draft[n] == targets[n]:
        n += 1
    return n, list(draft[:n]) + [targets[n]]


def accept_tree_greedy(tokens: list[int], parents: list[int], targets: list[int]) -> tuple[list[int], list[int]]:
    """Greedy rule for a token tree: from the root, follow the child whose token is the argmax of its parent's row
    (``targets``: row 0 the root, row i + 1 node i) while there is one: (accepted nodes root to leaf, their tokens
    then the model's own token)."""
    if len(targets) != len(tokens) + 1:
        raise ValueError(
            f"the greedy rule takes one target per tree row: {len(tokens) + 1} for a tree of {len(tokens)} nodes "
            f"and its root, got {len(targets)}"
        )
    kids = children(parents)
    path: list[int] = []
    node = -1
    while True:
        want = targets[node + 1]
        follow = next((c for c in kids[node] if tokens[c] == want), None)
        if follow is None:
            return path, [tokens[i] for i in path] + [want]
        path.append(follow)
        node = follow


# -- the rollback ----------------------------------------------------------------------------------------------------


class CacheRollback:
    """Rewinds a model's caches by the rejected tail of a verification.

    Key-value caches are trimmed. ``model`` is needed only for hybrid models (caches that cannot be trimmed): their
    recurrent layers are recorded during each verification (``specbench.core.rollback.RecurrentRecorder``).
    """

    def __init__(self, cache: list[Any], model: nn.Module | None = None):
        self.cache = cache
        recurrent = [i for i, c in enumerate(cache) if not c.is_trimmable()]
        self.recorder: RecurrentRecorder | None = None
        if recurrent:
            unsupported = sorted({type(cache[i]).__name__ for i in recurrent if not isinstance(cache[i], ArraysCache)})
            if unsupported:
                raise ValueError(
                    f"speculative decoding needs caches that can roll back, but this model uses "
                    f"{', '.join(unsupported)}; use plain generation (no drafter) for this model"
                )
            if model is None:
                raise ValueError(
                    "this model keeps recurrent state (ArraysCache): pass the model, "
                    "CacheRollback(cache, model), so its recurrent layers can be recorded"
                )
            self.recorder = RecurrentRecorder(model, cache, recurrent)

    def before_verify(self, width: int) -> None:
        """Called before a verification of ``width`` tokens extends the caches."""
        if self.recorder is not None:
            self.recorder.arm(width)

    def compact(self, width: int, keep: list[int]) -> None:
        """After a verification of ``width`` rows (a token tree), keep only rows ``keep`` (increasing
        indices into those rows: the root and the accepted path) in that order, and drop the rest.
        A prefix is a plain rewind."""
        if keep == list(range(len(keep))):
            self.rewind(width - len(keep))
            return
        if self.recorder is not None:
            raise ValueError("a model with recurrent state cannot keep a branch of a token tree: draft paths")
        for c in self.cache:
            base = c.offset - width
            rows = mx.array([base + r for r in keep], dtype=mx.int32)
            end = base + len(keep)
            for name in ("keys", "values"):
                buffers = getattr(c, name)
                for b in buffers if isinstance(buffers, tuple) else (buffers,):
                    b[..., base:end, :] = b[..., rows, :]
            c.offset = end

    def rewind(self, num_rejected: int) -> None:
        """Drop the state of the last ``num_rejected`` verified positions."""
        if self.recorder is not None:
            self.recorder.restore(num_rejected)
        if num_rejected > 0:
            for c in self.cache:
                if c.is_trimmable():
                    c.trim(num_rejected)
