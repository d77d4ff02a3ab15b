"""Why a step decoded plainly or drafted fewer tokens than its policy's longest: the reason codes of the step log.

A reason is "code: detail" or "code" (``StepRecord.reason``), written inline where it is decided (a step calls no
function for it); ``StepLog.stats()["reasons"]`` counts steps per code. The
engine's own codes are below; a policy gives its own (its name first, e.g. "auto-paused: ...") in the decision it
answers (``Speculate.reason``, ``Plain.reason``).
"""

from __future__ import annotations

#: Decoding without a drafter: every step is plain.
NO_DRAFTER = "no-drafter"
#: The plain step a pipelined target queued ahead of a speculative decision (its draft waits for that token).
PIPELINED = "pipelined"
#: One token left to generate: nothing to draft.
LAST_TOKEN = "last-token"
#: The draft cut to the tokens left to generate (a verification emits one of its own).
TOKENS_LEFT = "tokens-left"
#: The drafter proposed fewer tokens than asked (none: a plain step instead).
DRAFTER_SHORT = "drafter-short"
#: The draft cut where the drafter's confidence fell under the policy's threshold.
CONFIDENCE_CUT = "confidence-cut"
#: A policy's shorter draft or plain stretch that gave no reason of its own.
POLICY = "policy"


__all__ = [
    "CONFIDENCE_CUT",
    "DRAFTER_SHORT",
    "LAST_TOKEN",
    "NO_DRAFTER",
    "PIPELINED",
    "POLICY",
    "TOKENS_LEFT",
]
