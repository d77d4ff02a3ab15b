"""What a draft-length policy answers once per step: speculate (draft k tokens, verify them) or decode plainly."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Speculate:
    """Draft ``k`` tokens and verify them; ``probing``: a probe whose drafts are expected to be rejected
    (a pipelined target then queues the plain step after a full rejection while it verifies);
    ``min_confidence``: cut the draft before its first token the drafter gave a lower probability."""

    k: int
    probing: bool = False
    min_confidence: float = 0.0
    #: Why this length (``specbench.core.reasons``): "" where it is the policy's longest. Not part of the decision.
    reason: str = field(default="", compare=False)


@dataclass(frozen=True)
class Plain:
    """Decode ``n`` plain steps; ``shadow``: tokens to draft first and not verify, logged on the stretch's
    first step (``draft_tokens``, ``draft_s``) for the policy to compare with the tokens decoded."""

    n: int
    shadow: int = 0
    #: Why no draft now (``specbench.core.reasons``). Not part of the decision.
    reason: str = field(default="", compare=False)


#: What a policy answers once per step.
Decision = Speculate | Plain

__all__ = ["Decision", "Plain", "Speculate"]
