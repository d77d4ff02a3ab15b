"""Acceptance rules: greedy, and lossless speculative sampling (min(1, p/q), residual)."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_sampler


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


def accept_greedy(draft: list[int], targets: list[int]) -> tuple[int, list[int]]:
    """Greedy rule: accept the longest prefix of ``draft`` equal to the model's argmax.

    ``targets`` has one more entry than ``draft`` (the bonus position). Returns the number of
    accepted draft tokens and the emitted tokens (accepted drafts, then the model's own token).
    """
    n = 0
    while n < len(draft) and draft[n] == targets[n]:
        n += 1
    return n, list(draft[:n]) + [targets[n]]


def accept_sampled(p: mx.array, draft: list[int], q: mx.array | None) -> tuple[int, list[int], list[float]]:
    """Lossless speculative sampling (Leviathan et al.; Chen et al.).

    ``p``: target distributions [k+1, vocab]; ``draft``: k proposed tokens; ``q``: the drafter's
    distributions [k, vocab], or ``None`` for a deterministic drafter (q one-hot at the draft).
    Draft token i is accepted with probability min(1, p_i(d_i)/q_i(d_i)); the first rejected one
    is replaced by a sample of normalize(max(0, p_i - q_i)); after a fully accepted draft a bonus
    token is sampled from p_k. Returns (accepted count, emitted tokens, acceptance probabilities).
    """
    k = len(draft)
    d = mx.array(draft, dtype=mx.int32)
    p_draft = mx.take_along_axis(p[:k], d[:, None], axis=-1)[:, 0]
    if q is None:
        q_rows = mx.zeros_like(p[:k])
        q_rows = mx.put_along_axis(q_rows, d[:, None], mx.array(1.0, p.dtype), axis=-1)
    else:
        q_rows = q.astype(p.dtype)
    q_draft = mx.take_along_axis(q_rows, d[:, None], axis=-1)[:, 0]
    ratio = mx.minimum(1.0, p_draft / mx.maximum(q_draft, 1e-30))
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
