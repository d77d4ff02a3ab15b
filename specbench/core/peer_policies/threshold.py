"""A confidence threshold: draft up to ``max_k`` tokens, stopping where the drafter's probability falls under
``threshold`` (DSpark/EAGLE style dynamic draft length).

Sources: llama.cpp's draft-model speculation, common/speculative.h (``common_speculative_params.p_min``,
"min probability required to accept a token in the draft": drafting stops at the first token whose draft
probability is under it; 0.75 by default in recent versions, 0.9 in early ones), and vllm-project/vllm pull
request #35301 (``draft_confidence_threshold``: early exit when the draft's confidence is low, after DISCO,
Mamou et al. 2024, arXiv:2405.04304). DSpark's own rule (a threshold on the drafter's confidence per block
position) was not found in the stored sources; its published description is this rule. The probability is
``Draft.confidence`` (a greedy draft model's softmax at its token) or q at the token; a drafter that gives
neither (prompt lookup; SuffixDecoding, whose own ``min_token_prob`` already stops its drafts) is drafted
whole, as ``fixed:max_k``. The engine cuts the draft after the drafter made it: the verification shrinks,
the drafting of cut tokens is still paid (drafters know nothing of policies).
"""

from __future__ import annotations

from specbench.core.draft import Drafter
from specbench.core.log import StepLog
from specbench.core.policies import PEERS, Decision, DraftPolicy, Speculate
from specbench.core.policy_args import check_k, real


class ConfidencePolicy(DraftPolicy):
    """Up to ``max_k`` tokens every step, cut before the first the drafter gave less than ``threshold``."""

    def __init__(self, threshold: float = 0.5, max_k: int = 8):
        self.threshold = real("threshold", threshold, 0.0, 1.0)
        self.max_k = check_k(max_k, "max_k")
        self.name = f"confidence:{self.threshold:g}:{self.max_k}"

    def decide(self, log: StepLog, drafter: Drafter) -> Decision:
        return Speculate(self.max_k, min_confidence=self.threshold)

    def longest_draft(self, drafter: Drafter | None) -> int:
        return self.max_k

    @classmethod
    def from_text(cls, text: str) -> ConfidencePolicy:
        """``confidence``, ``confidence:THRESHOLD`` or ``confidence:THRESHOLD:MAX_K``."""
        parts = text.split(":") if text else []
        try:
            threshold = float(parts[0]) if parts else 0.5
            max_k = int(parts[1]) if len(parts) > 1 else 8
        except ValueError:
            raise ValueError(f"confidence:{text}: use confidence[:THRESHOLD[:MAX_K]] (e.g. confidence:0.6:8)") from None
        if len(parts) > 2:
            raise ValueError(f"confidence:{text}: use confidence[:THRESHOLD[:MAX_K]]")
        return cls(threshold, max_k)


PEERS.add("confidence", ConfidencePolicy)
