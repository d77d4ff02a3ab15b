"""Speculative decoding as users call it: the verifier and the policy's break-even chosen up front.

``speculative_generate`` picks the verifier once (exact for greedy decoding unless asked
otherwise) and, for a policy that needs one (``DraftPolicy.auto()``), the break-even from the
model's cost profile: the stored one, or a quick measurement taken now, before generation starts,
never inside it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import mlx.nn as nn

from specbench.core.draft import Drafter
from specbench.core.engine import Generation, generate
from specbench.core.options import GenerateOptions, VerifyMode, checked_options
from specbench.core.policies import DraftPolicy
from specbench.core.verify import FAST
from specbench.cost import Profile, break_even_tokens, profile_for
from specbench.exact import verifier_for


def _say(text: str) -> None:
    print(f"specbench: {text}", file=sys.stderr, flush=True)


def break_even_function(profile: Profile, drafter: Drafter, mode: VerifyMode) -> Callable[[int], float]:
    """k -> tokens a verification of k drafts must yield to match plain decoding, from ``profile``."""
    return lambda k: break_even_tokens(profile, k, drafter, verify=mode)


def speculative_generate(
    model: nn.Module,
    prompt_ids: Any,
    options: GenerateOptions | None = None,
    drafter: Drafter | None = None,
    policy: DraftPolicy | None = None,
    tokenizer: Any = None,
    prompt_cache: list[Any] | None = None,
    profile: Profile | None = None,
    progress: Callable[[str], None] | None = _say,
) -> Generation:
    """Speculative decoding: ``drafter`` proposes, one forward pass verifies, ``policy`` (default
    ``DraftPolicy.auto()``) picks draft lengths. Greedy output equals ``generate``'s.

    ``profile``: the cost profile Auto plans with (default: the stored one for this model and
    device, else a quick one measured before the first token, reported through ``progress``).
    """
    options = checked_options(options)
    mode = options.verify_mode
    verifier = verifier_for(model, mode) if drafter is not None else FAST
    generation = Generation(
        model,
        prompt_ids,
        options,
        drafter=drafter,
        policy=policy,
        tokenizer=tokenizer,
        prompt_cache=prompt_cache,
        verifier=verifier,
    )
    if drafter is not None and generation.policy.needs_break_even:
        profile = profile or profile_for(model, mode, progress=progress)
        generation.break_even = break_even_function(profile, drafter, mode)
    return generation


__all__ = ["break_even_function", "generate", "speculative_generate"]
