"""Lossless speculative sampling (min(1, p/q), residual), for paths and trees, the sampler's settings, and sampling by
position (the greedy rule is ``specbench.core.verify.accept_greedy``).

Sampling by position (``GenerateOptions.sample_by_position``): the target's token at output position i is the
Gumbel-max draw argmax(log p_i + g_i), its noise g_i drawn with a key made of (seed, i) alone
(``draw_by_position``). Plain decoding and verification draw it alike, so the token at a position does not depend on
how it was reached; a rule that accepts a drafted token exactly when it equals that draw (and emits the draw after
the accepted ones) then yields plain sampling's tokens. ``specbench.core.rules`` says which rules can.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_sampler

from specbench.core.tree import children


@dataclass(frozen=True)
class SamplingSettings:
    """The sampler's settings; temperature 0 means greedy."""

    temperature: float = 0.0
    top_p: float = 1.0
    min_p: float = 0.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def sampler(self):
        """mlx-lm's sampler for these settings (plain decoding)."""
        return make_sampler(self.temperature, top_p=self.top_p, min_p=self.min_p, top_k=self.top_k)

    def probs(self, logits: mx.array) -> mx.array:
        """The filtered target distribution p for each row of ``logits`` ([..., vocab]).

        Filters apply in mlx-lm's order (top-p, min-p, top-k) to log-probabilities, then the
        temperature, so sampling from p is sampling with ``sampler()``.
        """
        logits = logits.astype(mx.float32)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if 0 < self.top_p < 1.0:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.min_p != 0.0:
            logprobs = apply_min_p(logprobs, self.min_p)
        if self.top_k > 0:
            logprobs = apply_top_k(logprobs, self.top_k)
        return mx.softmax(logprobs * (1.0 / self.temperature), axis=-1)


def position_key(seed: int, position: int) -> mx.array:
    """The random key of output position ``position`` under ``seed``: a function of the two alone (numpy's
    SeedSequence hashes them into 64 bits), so every draw at a position is the same wherever it is made."""
    state = np.random.SeedSequence([int(seed), int(position)]).generate_state(1, np.uint64)[0]
    return mx.random.key(int(state))


def draw_by_position(p: mx.array, seed: int, positions: Sequence[int]) -> mx.array:
    """The target's token at each row of ``p`` ([n, vocab] distributions) sampled by position: the Gumbel-max draw
    argmax(log p + g), row r's noise g drawn with ``position_key(seed, positions[r])``; distributed as p. Each row
    is computed on its own values, so a row gives the same token in a plain step and in a verification."""
    if len(positions) != p.shape[0]:
        raise ValueError(f"draw_by_position takes one position per row: {p.shape[0]} rows, {len(positions)} positions")
    vocab = p.shape[-1]
    noise = mx.stack([mx.random.gumbel(shape=(vocab,), key=position_key(seed, i)) for i in positions])
    return mx.argmax(mx.log(p.astype(mx.float32)) + noise, axis=-1)


def check_tables(p: Any, drafted: int, q: Any = None, rule: str = "token") -> None:
    """One clear ValueError unless ``p`` holds a row per drafted token and the bonus row ([drafted + 1, vocab]) and
    ``q``, when given, a row per drafted token of p's vocabulary ([drafted, vocab]); a row short would be read
    past its end."""
    shape = tuple(getattr(p, "shape", ()))
    if len(shape) != 2 or shape[0] != drafted + 1:
        raise ValueError(
            f"acceptance rule {rule!r}: the target's probabilities p have shape {shape}, but a draft of {drafted} "
            f"tokens needs ({drafted + 1}, vocab): one row per drafted token and the bonus row"
        )
    if q is not None and tuple(getattr(q, "shape", ())) != (drafted, shape[1]):
        raise ValueError(
            f"acceptance rule {rule!r}: the drafter's probabilities q have shape {tuple(getattr(q, 'shape', ()))}, "
            f"but a draft of {drafted} tokens needs ({drafted}, {shape[1]}): one row per drafted token"
        )


def accept_sampled(
    p: mx.array, draft: list[int], q: mx.array | None, draws: list[int] | None = None
) -> tuple[int, list[int], list[float]]:
    """Lossless speculative sampling (Leviathan et al.; Chen et al.).

    ``p``: target distributions [k+1, vocab]; ``draft``: k proposed tokens; ``q``: the drafter's
    distributions [k, vocab], or ``None`` for a deterministic drafter (q one-hot at the draft).
    Draft token i is accepted with probability min(1, p_i(d_i)/q_i(d_i)); the first rejected one
    is replaced by a sample of normalize(max(0, p_i - q_i)); after a fully accepted draft a bonus
    token is sampled from p_k. Returns (accepted count, emitted tokens, acceptance probabilities).

    ``draws`` (sampling by position; deterministic drafts only): the target's own token at each row. The rule's
    randomness is then these draws: d_i is accepted iff d_i = y_i (probability p_i(d_i) = min(1, p_i(d_i)/1)),
    and a rejection emits y_i, distributed given y_i != d_i as the residual normalize(max(0, p_i - onehot(d_i))).
    """
    k = len(draft)
    check_tables(p, k, q)
    if draws is not None:
        check_draws(draws, k + 1, q, "token")
    d = mx.array(draft, dtype=mx.int32)
    p_draft = mx.take_along_axis(p[:k], d[:, None], axis=-1)[:, 0]
    if q is None:
        q_rows = mx.zeros_like(p[:k])
        q_rows = mx.put_along_axis(q_rows, d[:, None], mx.array(1.0, p.dtype), axis=-1)
    else:
        q_rows = q.astype(p.dtype)
    q_draft = mx.take_along_axis(q_rows, d[:, None], axis=-1)[:, 0]
    ratio = mx.minimum(1.0, p_draft / mx.maximum(q_draft, 1e-30))
    if draws is not None:  # the rule's decisions coupled to the target's own draws
        n = next((i for i in range(k) if draft[i] != draws[i]), k)
        last = int(draws[n])
    else:
        uniform = mx.random.uniform(shape=(k,))
        residual = mx.maximum(p[:k] - q_rows, 0.0)
        # A row whose residual is all zeros has p == q there: its draft token is always accepted,
        # so that row's replacement sample is never used.
        replacements = mx.random.categorical(mx.log(residual))
        bonus_token = mx.random.categorical(mx.log(p[k]))
        accepted = uniform < ratio
        mx.eval(accepted, replacements, bonus_token, ratio)
        accepted = accepted.tolist()
        n = 0
        while n < k and accepted[n]:
            n += 1
        last = int(bonus_token.item()) if n == k else int(replacements[n].item())
    return n, list(draft[:n]) + [last], [float(x) for x in ratio.tolist()]


def check_draws(draws: Sequence[int], rows: int, q: Any, rule: str) -> None:
    """One clear error unless ``draws`` holds one token per row and the drafts are deterministic (``q`` None)."""
    if len(draws) != rows:
        raise ValueError(f"acceptance rule {rule!r}: {len(draws)} draws by position for {rows} rows: give one per row")
    if q is not None:
        raise ValueError(
            f"acceptance rule {rule!r} cannot give plain sampling's tokens with drafts sampled from q: "
            "use acceptance 'exact-match' or deterministic drafts"
        )


def accept_tree_sampled(
    p: mx.array, tokens: list[int], parents: list[int], q: mx.array | None, draws: list[int] | None = None
) -> tuple[list[int], list[int], list[float]]:
    """Lossless sampling over a token tree: SpecInfer's recursive rejection sampling over siblings
    (Miao et al., "SpecInfer", multi-step speculative sampling).

    ``p``: target distributions, one row per tree row [n + 1, vocab] (row 0 the root); ``q``: the
    drafter's distribution for each node [n, vocab] (the distribution its token was drawn from
    given its earlier siblings), or None (deterministic: q one-hot at the node's token). At a node,
    its children are tried in order: child c is accepted with probability
    min(1, r(x_c) / q_c(x_c)), r starting as the node's p; on rejection r becomes
    normalize(max(0, r - q_c)). When no child is accepted a token is sampled from r (for a node
    without children, from p). Returns (accepted nodes, emitted tokens, min(1, r/q) of each
    child tried).

    ``draws`` (sampling by position; deterministic drafts only): the target's own token at each tree row. Child c
    is then accepted iff its token is the row's draw y, which given that no earlier sibling was (y outside their
    tokens) has probability r(x_c), as the rule's; with no child accepted the draw is emitted, distributed given
    that as the last r.
    """
    check_tables(p, len(tokens), q)
    if draws is not None:
        check_draws(draws, len(tokens) + 1, q, "token")
    kids = children(parents)
    path: list[int] = []
    ratios: list[float] = []
    node = -1
    while True:
        kid = kids[node]
        row = p[node + 1]
        q_rows = q[mx.array(kid, dtype=mx.int32)] if q is not None and kid else None
        coins = mx.random.uniform(shape=(len(kid) + 1,)) if draws is None else mx.zeros((len(kid) + 1,))
        mx.eval(row, coins, *([q_rows] if q_rows is not None else []))
        residual = np.array(row.astype(mx.float32), dtype=np.float64)
        uniform = np.array(coins, dtype=np.float64)
        accepted = None
        for j, child in enumerate(kid):
            x = tokens[child]
            if q_rows is None:
                ratio = min(1.0, float(residual[x]))
                residual[x] = 0.0
            else:
                q_row = np.array(q_rows[j].astype(mx.float32), dtype=np.float64)
                ratio = min(1.0, float(residual[x] / max(q_row[x], 1e-30)))
                residual = np.maximum(residual - q_row, 0.0)
            ratios.append(ratio)
            if (uniform[j] < ratio) if draws is None else (x == draws[node + 1]):
                accepted = child
                break
            total = residual.sum()
            residual = residual / total if total > 0 else np.array(row, dtype=np.float64)
        if accepted is None and draws is not None:
            return path, [tokens[i] for i in path] + [int(draws[node + 1])], ratios
        if accepted is None:
            return path, [tokens[i] for i in path] + [inverse_cdf(residual, uniform[-1])], ratios
        path.append(accepted)
        node = accepted


def inverse_cdf(row: np.ndarray, u: float) -> int:
    """The token whose cumulative mass in ``row`` (unnormalised) first exceeds ``u`` of the total."""
    cdf = np.cumsum(row)
    return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), len(cdf) - 1)
