"""Speculative decoding as users call it: the verifier and the policy's break-even chosen up front.

``speculative_generate`` picks the verifier once (exact for greedy decoding unless asked
otherwise; its verify widths calibrated now) and, for a policy that needs one
(``DraftPolicy.auto()``), the break-even from the model's cost profile: the stored one, or a quick
measurement taken now, before generation starts, never inside it. A tree drafter's verifications are
costed by node count when this model's tree costs are stored (``specbench.cost.trees.tree_costs_for``).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Sequence

import mlx.nn as nn

from specbench.common.distributed import is_sharded
from specbench.common.identity import display_name
from specbench.core.batch import BatchGeneration, requested_verify_mode
from specbench.core.batch import generate_batch as plain_batch
from specbench.core.draft import Drafter, within_max_draft, within_max_tokens
from specbench.core.engine import Generation, plain_generation
from specbench.core.forward import context_length
from specbench.core.lockstep import in_lockstep
from specbench.core.options import GenerateOptions, checked_options
from specbench.core.policies import DraftPolicy
from specbench.core.policy_args import MAX_DRAFT_LENGTH
from specbench.core.types import BatchDrafters, BatchOptions, BatchPolicies, Prompt, PromptCache, Tokenizer
from specbench.core.verify import FAST, VerifyMode
from specbench.cost import Profile, profile_for
from specbench.cost.breakeven import BreakEven
from specbench.cost.measure import lockstep_profile
from specbench.cost.trees import stored_tree_costs, tree_break_even
from specbench.exact import batch_verifier, verifier_for


def _say(text: str) -> None:
    print(f"specbench: {text}", file=sys.stderr, flush=True)


def break_even_function(profile: Profile, drafter: Drafter, verify: VerifyMode) -> BreakEven:
    """k -> tokens a verification of k drafts must yield to match plain decoding, from ``profile``; its
    ``at_length(L)`` gives the one at the profile's context length nearest L (Auto follows the context)."""
    return BreakEven(profile, drafter, verify)


def generate(
    model: nn.Module,
    prompt: Prompt,
    options: GenerateOptions | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    prompt_cache: PromptCache | None = None,
) -> Generation:
    """Plain decoding of ``prompt`` (text or token ids) with the same options, log and stats as speculative
    decoding. Greedy decoding (exact mode) runs one-row products through specbench's row-invariant kernels
    where this device measured them faster (``specbench.exact.one_row``: on CUDA; bit-identical to the model's
    own products, so the output is the model's greedy output)."""
    options = checked_options(options)
    verifier = verifier_for(model, options.verify_mode)  # the exact verifier chooses its one-row kernels now
    return plain_generation(model, prompt, options, tokenizer=tokenizer, prompt_cache=prompt_cache, verifier=verifier)


def speculative_generate(
    model: nn.Module,
    prompt: Prompt,
    options: GenerateOptions | None = None,
    *,
    drafter: Drafter | None = None,
    policy: DraftPolicy | None = None,
    tokenizer: Tokenizer | None = None,
    prompt_cache: PromptCache | None = None,
    profile: Profile | None = None,
    progress: Callable[[str], None] | None = _say,
) -> Generation:
    """Speculative decoding: ``drafter`` proposes, one forward pass verifies, ``policy`` (default
    ``DraftPolicy.auto()``) picks draft lengths. Greedy output equals ``generate``'s.

    ``profile``: the cost profile Auto plans with (default: the stored one for this model and
    device, else a quick one measured before the first token, reported through ``progress``).
    In exact mode every verify width the policy may use is calibrated here too, at the cache lengths the
    generation reaches (prompt and ``max_tokens``), before the first token (reported through ``progress``), so
    that no timed step pays for calibration; ``options.audit`` compares a share of the verifications with
    serial steps (``stats()["exact_audit"]``).
    """
    options = checked_options(options)
    verify = options.verify_mode
    sharded = is_sharded(model)
    if sharded:  # every rank runs this loop: rank 0 drafts and picks draft lengths for all
        drafter, policy = in_lockstep(drafter, policy)
    verifier = verifier_for(model, verify, audit=options.audit, seed=options.seed) if drafter is not None else FAST
    generation = Generation(
        model,
        prompt,
        options,
        drafter=drafter,
        policy=policy,
        tokenizer=tokenizer,
        prompt_cache=prompt_cache,
        verifier=verifier,
    )
    _check_target(drafter, model, tokenizer)
    longest = _fitting_draft_length(model, generation.policy, drafter) if drafter is not None else 1
    if drafter is not None:
        # Every width the policy may verify, calibrated now (exact mode, and fast mode where the kernels run): never
        # inside the timed generation. A generation of max_tokens tokens drafts at most max_tokens - 1 of them (the
        # engine caps k at the tokens left but one). At the cache lengths this generation reaches: past them an exact
        # verification would run serially.
        limit = context_length(model)
        held = getattr(generation.target.inner, "held", 0)
        reach = max(len(generation.prompt), held) + options.max_tokens
        widths = range(2, within_max_tokens(longest, options.max_tokens) + 2)
        verifier.prepare(widths, with_estimate(progress), context=reach if limit is None else min(reach, limit))
    if drafter is not None and generation.policy.needs_break_even:
        profile = profile or (lockstep_profile if sharded else profile_for)(model, verify, progress=progress)
        generation.break_even = break_even_function(profile, drafter, verify)
        if getattr(drafter, "tree", False) is True:  # a tree's k is its node count: costed by node count when stored
            stored = stored_tree_costs(model, verify)
            if stored is not None:
                generation.break_even = tree_break_even(stored, drafter)
    return generation


def _check_target(drafter: Drafter | None, model: nn.Module, tokenizer: Tokenizer | None) -> None:
    """A drafter made without its target (a ``DraftModel`` without ``target=``) checks the target's
    vocabulary here, before any model work: one ValueError on a mismatch."""
    if drafter is not None and getattr(drafter, "target_checked", True) is False:
        drafter.check_target(model, tokenizer)


def _fitting_draft_length(model: nn.Module, policy: DraftPolicy, drafter: Drafter) -> int:
    """The longest draft ``policy`` may ask of ``drafter``; a ValueError before any model work when it is over
    ``MAX_DRAFT_LENGTH`` or a verification of it (the draft and the last token) cannot fit in the model's context."""
    longest = within_max_draft(policy.longest_draft(drafter), drafter)  # the drafter never drafts more
    if longest > MAX_DRAFT_LENGTH:
        raise ValueError(
            f"policy {policy.name} may draft {longest} tokens with drafter {getattr(drafter, 'name', drafter)}, over "
            f"the longest draft specbench verifies ({MAX_DRAFT_LENGTH} tokens): choose a draft length of at most "
            f"{MAX_DRAFT_LENGTH}"
        )
    context = context_length(model)
    if context is not None and longest + 1 > context:
        raise ValueError(
            f"policy {policy.name} may draft {longest} tokens, but {display_name(model)} has a context of "
            f"{context} tokens: choose a draft length below {context}"
        )
    return longest


def with_estimate(progress: Callable[[str], None] | None) -> Callable[[str], None] | None:
    """``progress`` with the time left added to each "I/N" step of a calibration (from the steps so far)."""
    if progress is None:
        return None
    started = time.perf_counter()

    def say(message: str) -> None:
        step = re.search(r"calibration (\d+)/(\d+)", message)
        if step and int(step[1]) < int(step[2]):
            done, total = int(step[1]), int(step[2])
            left = (time.perf_counter() - started) / done * (total - done)
            message += f"; about {int(left) // 60}:{int(left) % 60:02d} left"
        progress(message)

    return say


def generate_batch(
    model: nn.Module,
    prompts: Sequence[Prompt],
    options: BatchOptions = None,
    *,
    tokenizer: Tokenizer | None = None,
    max_batch: int | None = None,
) -> BatchGeneration:
    """Plain batched decoding with the same options, logs and stats as batched speculative decoding; with
    ``verify="exact"`` every request's tokens equal its own ``generate`` greedy output, whatever else is batched."""
    verify = requested_verify_mode(options, len(prompts)) or "fast"
    verifier = batch_verifier(model, verify)
    return plain_batch(model, prompts, options, tokenizer=tokenizer, max_batch=max_batch, verifier=verifier)


def speculative_generate_batch(
    model: nn.Module,
    prompts: Sequence[Prompt],
    options: BatchOptions = None,
    *,
    drafters: BatchDrafters = None,
    policy: BatchPolicies = None,
    tokenizer: Tokenizer | None = None,
    max_batch: int | None = None,
    profile: Profile | None = None,
    progress: Callable[[str], None] | None = _say,
) -> BatchGeneration:
    """Batched speculative decoding: each request drafts its own length (``drafters``: one per
    prompt, or a factory i -> drafter), one forward verifies the [B, w] block. Verification is fast mode
    unless the options ask for ``verify="exact"`` (every request's, or none's): then every batched forward
    computes each request's rows as its own single-request steps do (``specbench.exact.batch_verifier``), so
    each request's greedy output equals ``generate``'s whatever else is in the batch. A policy needing a
    break-even gets the profile's batch-1 break-even (``specbench.core.batch_policies.BatchAutoPolicy`` takes
    one per batch size).
    """
    verify = requested_verify_mode(options, len(prompts)) or "fast"
    verifier = batch_verifier(model, verify)
    generation = BatchGeneration(
        model, prompts, options, drafters, policy, tokenizer=tokenizer, max_batch=max_batch, verifier=verifier
    )
    for request in generation.requests:
        _check_target(request.drafter, model, tokenizer)
    if any(r.drafter is not None and r.policy.needs_break_even for r in generation.requests):
        profile = profile or profile_for(model, verify, progress=progress)
        drafter = next(r.drafter for r in generation.requests if r.drafter is not None)
        generation.set_break_even(break_even_function(profile, drafter, verify))
    return generation


__all__ = [
    "break_even_function",
    "generate",
    "generate_batch",
    "speculative_generate",
    "speculative_generate_batch",
]
