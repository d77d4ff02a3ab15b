"""Top-k match: a drafted token is kept when it is among the target's ``top`` likeliest tokens at its position.

A relaxed exact match (as in the lenient verification of "SpecDec" and of draft-and-verify with top-k candidates):
where exact match keeps a token only when it is the target's own sample, this keeps any of the target's ``top``
likeliest tokens (ties at the ``top``-th probability included; never one p gives no mass), so it keeps at least
what greedy verification keeps (the argmax is always among them) and more. **Lossy**: the output is no longer
distributed as plain sampling's (it favours the drafter's choices among the top tokens), so it is refused where
plain sampling's tokens are promised (``sample_by_position``) and tables mark it "(lossy)". At temperature 0 it is
greedy, as every rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import mlx.core as mx

from specbench.core.policy_args import whole
from specbench.core.rules import PassingRule, drafted_probabilities, register_rule


@register_rule
@dataclass(frozen=True)
class TopKMatch(PassingRule):
    """Keep the longest drafted prefix whose every token is among the target's ``top`` likeliest there."""

    name: ClassVar[str] = "top-k-match"
    description: ClassVar[str] = "a draft token is kept when among the target's top likeliest (default 5; lossy)"
    top: int = 5

    def __post_init__(self) -> None:
        whole("top-k-match top", self.top, 1)

    def passes(self, p: mx.array, tokens: mx.array) -> mx.array:
        drafted = drafted_probabilities(p, tokens)
        kth = mx.min(mx.topk(p, min(self.top, p.shape[-1]), axis=-1), axis=-1)
        return (drafted >= kth) & (drafted > 0)
