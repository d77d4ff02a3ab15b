"""Is speculative sampling lossless here? Token histograms of plain and speculative samples from one
prompt, compared with a permutation test of the chi-square homogeneity statistic."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from tqdm.auto import tqdm

from specbench.core.engine import generate
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy, as_policy
from specbench.decoding import speculative_generate
from specbench.experiments.capabilities import usable_drafters
from specbench.experiments.timing import cache_copy, prefix_cache


@dataclass
class LosslessCheck:
    """Token histograms of plain and speculative sampling from one prompt, and their comparison.

    ``counts``: token id, text, plain and speculative counts (the ``top`` most frequent tokens,
    then one "other" row); ``p_value``: permutation test of the chi-square homogeneity statistic
    over whole samples (sequences are exchangeable when the sampler is lossless).
    """

    counts: pl.DataFrame
    statistic: float
    p_value: float
    tvd: float
    samples: int
    max_tokens: int
    drafter: str
    policy: str
    temperature: float
    acceptance_rate: float
    plain_sequences: list[list[int]]
    speculative_sequences: list[list[int]]


def chi2(a: np.ndarray, b: np.ndarray) -> float:
    """Chi-square homogeneity statistic of two count vectors (categories empty in both are left out)."""
    total = a + b
    keep = total > 0
    a, b, total = a[keep], b[keep], total[keep]
    na, nb = a.sum(), b.sum()
    ea, eb = total * na / (na + nb), total * nb / (na + nb)
    return float(((a - ea) ** 2 / ea).sum() + ((b - eb) ** 2 / eb).sum())


def histogram_test(
    plain: Sequence[Sequence[int]], speculative: Sequence[Sequence[int]], permutations: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(chi-square statistic, permutation p-value, total variation distance) of two sets of
    sampled sequences' pooled token histograms."""
    sequences = list(plain) + list(speculative)
    vocab = sorted({t for s in sequences for t in s})
    if not vocab:
        raise ValueError("no sampled tokens to compare")
    index = {t: i for i, t in enumerate(vocab)}
    matrix = np.zeros((len(sequences), len(vocab)))
    for row, seq in enumerate(sequences):
        for t in seq:
            matrix[row, index[t]] += 1
    labels = np.zeros(len(sequences), dtype=bool)
    labels[len(plain) :] = True
    stat = chi2(matrix[~labels].sum(0), matrix[labels].sum(0))
    rng = np.random.default_rng(seed)
    exceed = 0
    for _ in range(permutations):
        perm = rng.permutation(labels)
        exceed += chi2(matrix[~perm].sum(0), matrix[perm].sum(0)) >= stat
    a, b = matrix[~labels].sum(0), matrix[labels].sum(0)
    tvd = 0.5 * float(np.abs(a / a.sum() - b / b.sum()).sum())
    return stat, (exceed + 1) / (permutations + 1), tvd


def losslessness_check(
    model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[int],
    drafter: str = "lookup",
    policy: DraftPolicy | str | int = 4,
    temperature: float = 1.0,
    samples: int = 32,
    max_tokens: int = 8,
    seed: int = 0,
    top: int = 15,
    permutations: int = 2000,
    model_name: str | None = None,
    progress: bool = True,
) -> LosslessCheck:
    """Sample ``samples`` continuations plainly and ``samples`` speculatively (other seeds) and
    compare their token histograms. A lossless sampler gives a large p-value (uniform on [0, 1]
    over repeated checks); a biased one drives it towards 0 as samples grow. ``policy``: a policy
    object, its text ("fixed:4") or a draft length."""
    policy = as_policy(policy)
    if temperature <= 0:
        raise ValueError("the losslessness check samples: give a temperature > 0")
    if samples < 2:
        raise ValueError(f"samples must be >= 2, got {samples}")
    factories, skipped = usable_drafters([drafter], model, model_name or getattr(model, "specbench_name", None))
    if drafter in skipped:
        raise ValueError(f"drafter {drafter!r} is not usable here: {skipped[drafter]}")
    plain, spec = [], []
    drafted = accepted = 0
    prefix = prefix_cache(model, prompt_ids)
    for i in tqdm(range(samples), desc="sampling", disable=not progress, leave=False):
        options = GenerateOptions(max_tokens=max_tokens, temperature=temperature, seed=seed + i, ignore_eos=True)
        plain.append(list(generate(model, prompt_ids, options, prompt_cache=cache_copy(prefix))))
        options = GenerateOptions(
            max_tokens=max_tokens, temperature=temperature, seed=seed + samples + i, ignore_eos=True
        )
        made = factories[drafter]()
        gen = speculative_generate(model, prompt_ids, options, made, policy, prompt_cache=cache_copy(prefix, made))
        spec.append(list(gen))
        stats = gen.stats()
        drafted += stats["drafted"]
        accepted += stats["accepted"]
    stat, p, tvd = histogram_test(plain, spec, permutations, seed)
    counts_plain = np.bincount([t for s in plain for t in s], minlength=1)
    counts_spec = np.bincount([t for s in spec for t in s], minlength=1)
    size = max(len(counts_plain), len(counts_spec))
    counts_plain = np.pad(counts_plain, (0, size - len(counts_plain)))
    counts_spec = np.pad(counts_spec, (0, size - len(counts_spec)))
    order = np.argsort(-(counts_plain + counts_spec), kind="stable")[:top]
    order = [int(t) for t in order if counts_plain[t] + counts_spec[t] > 0]
    texts = [repr(tokenizer.decode([t]))[1:-1] if tokenizer is not None else str(t) for t in order]
    rest_plain = int(counts_plain.sum() - counts_plain[order].sum())
    rest_spec = int(counts_spec.sum() - counts_spec[order].sum())
    counts = pl.DataFrame(
        {
            "token": [*order, -1],
            "text": [*texts, "(other)"],
            "plain": [*(int(counts_plain[t]) for t in order), rest_plain],
            "speculative": [*(int(counts_spec[t]) for t in order), rest_spec],
        }
    )
    return LosslessCheck(
        counts,
        stat,
        p,
        tvd,
        samples,
        max_tokens,
        drafter,
        policy.name,
        temperature,
        accepted / drafted if drafted else 0.0,
        plain,
        spec,
    )
