"""Does speculative greedy decoding reproduce plain greedy decoding on this machine?

``check`` decodes each prompt with mlx-lm's own greedy decoding (``mlx_lm_greedy``, the reference) and
speculatively in each verify mode, drafting with the controlled-acceptance ``Oracle``
(the reference continuation, each position corrupted with probability 1 - acceptance, so drafts
are partly accepted and every acceptance count occurs), and records per prompt and mode whether
the outputs are equal and where they first differ. ``summarize`` condenses that per mode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import generate_step

from specbench.bench.turn_cache import first_divergence
from specbench.core.draft import Drafter
from specbench.core.engine import Generation
from specbench.core.forward import vocab_size
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.core.verify import VerifyMode, check_verify_mode
from specbench.drafters.oracle import Oracle, OracleTree
from specbench.exact.verifier import verifier_for

if TYPE_CHECKING:  # polars loads only where tables are made (the GPU scripts run without it)
    import polars as pl


def mlx_lm_greedy(
    model: nn.Module, prompt: Sequence[int], max_tokens: int, prefill_step_size: int = GenerateOptions.prefill_step_size
) -> list[int]:
    """mlx-lm's own greedy decoding of ``max_tokens`` tokens after ``prompt`` (EOS not checked): the
    reference that speculative greedy output must equal (prefilled in chunks of ``prefill_step_size``, as
    ``GenerateOptions`` prefills: pass both the same)."""
    steps = generate_step(mx.array(list(prompt)), model, max_tokens=max_tokens, prefill_step_size=prefill_step_size)
    return [int(t) for t, _ in steps]


def random_prompts(
    model: nn.Module, count: int, lengths: tuple[int, int] = (96, 224), seed: int = 7
) -> list[list[int]]:
    """Random token prompts; with 128 new tokens most cross the KV cache's 256-row buffer step."""
    rng = np.random.default_rng(seed)
    vocab = vocab_size(model)
    return [rng.integers(0, vocab, size=int(rng.integers(*lengths))).tolist() for _ in range(count)]


def oracle_generation(
    model: nn.Module,
    prompt: Sequence[int],
    reference: Sequence[int],
    max_tokens: int,
    k: int,
    verify: VerifyMode,
    acceptance: float,
    seed: int = 0,
    branches: int = 1,
    audit: float = 0.0,
    prefill_step_size: int = GenerateOptions.prefill_step_size,
) -> Generation:
    """Speculative greedy decoding of ``prompt`` (not yet run) with drafts of ``k`` tokens from the
    ``Oracle`` following ``reference`` at ``acceptance``, verified in mode ``verify``. With ``branches`` > 1
    the drafts are token trees (``OracleTree``: that many independently corrupted drafts, merged where they
    agree) of ``tree_nodes(k, branches)`` nodes. ``audit``: the share of exact verifications compared with serial
    steps (``stats()["exact_audit"]``); ``prefill_step_size``: the prompt's chunks (``GenerateOptions``)."""
    oracles = [Oracle(prompt, reference, acceptance, vocab_size(model), seed=seed + b) for b in range(branches)]
    drafter: Drafter = oracles[0] if branches == 1 else OracleTree(oracles, k)
    length = k if branches == 1 else tree_nodes(k, branches)
    options = GenerateOptions(
        max_tokens=max_tokens, verify=verify, ignore_eos=True, prefill_step_size=prefill_step_size
    )
    return Generation(
        model,
        list(prompt),
        options,
        drafter=drafter,
        policy=DraftPolicy.fixed(length),
        verifier=verifier_for(
            model, verify, widths=range(2, length + 2), audit=audit, seed=seed, context=len(prompt) + max_tokens
        ),
    )


#: The most nodes a tree check drafts: its verify width (nodes + 1) stays within the widths paths calibrate.
MAX_TREE_NODES = 15


def tree_nodes(depth: int, branches: int) -> int:
    """Nodes of the tree check's drafts of ``branches`` paths of ``depth`` tokens (at most ``MAX_TREE_NODES``)."""
    return min(depth * branches, MAX_TREE_NODES)


def check(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    max_tokens: int = 64,
    draft_lengths: Sequence[int] = (2, 4, 7, 15),
    acceptance: float = 0.8,
    modes: Sequence[VerifyMode] = ("exact", "fast"),
    seed: int = 0,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> pl.DataFrame:
    """One row per (prompt, verify mode): ``equal`` to plain greedy, ``first_divergence``, and the
    run's verifications and accepted drafts. Prompt i drafts ``draft_lengths[i % len]`` tokens."""
    if not prompts:
        raise ValueError("no prompts to check")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if not draft_lengths or min(draft_lengths) < 1:
        raise ValueError(f"draft lengths must be >= 1, got {list(draft_lengths)}")
    if not modes:
        raise ValueError("no verify modes to check")
    for mode in modes:
        check_verify_mode(mode)
    rows = []
    for i, prompt in enumerate(prompts):
        k = int(draft_lengths[i % len(draft_lengths)])
        reference = mlx_lm_greedy(model, prompt, max_tokens)
        for mode in modes:
            generation = oracle_generation(model, prompt, reference, max_tokens, k, mode, acceptance, seed=seed + i)
            output = list(generation)
            stats = generation.stats()
            row = {
                "prompt": i,
                "prompt_tokens": len(prompt),
                "mode": mode,
                "k": k,
                "tokens": len(output),
                "equal": output == reference,
                "first_divergence": first_divergence(output, reference),
                "verifies": stats["verifies"],
                "accepted": stats["accepted"],
            }
            rows.append(row)
            if progress is not None:
                progress(row)
    import polars as pl

    return pl.DataFrame(rows, schema_overrides={"first_divergence": pl.Int64})


def summarize(rows: pl.DataFrame) -> pl.DataFrame:
    """Per verify mode: prompts equal to plain greedy, first divergence min / median / max, and
    accepted drafts per verification."""
    import polars as pl

    divergence = pl.col("first_divergence")
    return rows.group_by("mode", maintain_order=True).agg(
        prompts=pl.len().cast(pl.Int64),
        equal=pl.col("equal").sum().cast(pl.Int64),
        first_divergence_min=divergence.min(),
        first_divergence_median=divergence.median().cast(pl.Float64),
        first_divergence_max=divergence.max(),
        accepted_per_verify=pl.col("accepted").sum() / pl.max_horizontal(pl.col("verifies").sum(), 1),
    )
