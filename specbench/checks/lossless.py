"""Is speculative sampling lossless here? Token histograms of plain and speculative samples from one
prompt, compared with a permutation test of the chi-square homogeneity statistic.

The check states its power: a run in which few drafted tokens were accepted never exercised the
acceptance rule, and histograms whose expected counts are tiny cannot show a difference, so such a
run is "inconclusive", not a pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any

import numpy as np
import polars as pl
from tqdm import tqdm  # text bars: a notebook run by `specbench report` shows them on the console

from specbench.bench.timing import cache_copy, prefix_cache
from specbench.core.engine import plain_generation
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy, as_policy
from specbench.core.rules import AcceptanceRule, rule_for
from specbench.decoding import speculative_generate
from specbench.inputs.capabilities import usable_drafters

#: Accepted draft tokens below which the check is inconclusive: the acceptance rule was hardly used.
MIN_ACCEPTED = 20
#: Expected count per sampler a token needs to count as well filled, and the share of sampled tokens
#: that must be well filled for the histograms to carry a signal.
MIN_EXPECTED = 5
MIN_WELL_FILLED = 0.5
#: Power at which the minimum detectable difference is stated.
POWER = 0.8


@dataclass
class LosslessCheck:
    """Token histograms of plain and speculative sampling from one prompt, and their comparison: ``counts`` (the
    ``top`` most frequent tokens, then one "other" row), ``histogram_test``'s p-value and TVD, ``tvd_interval``'s
    interval and noise (``tvd_null``: a TVD above it is a shift), ``well_filled_share``, ``min_detectable_tvd``
    and ``lossless_verdict``'s verdict and reason."""

    counts: pl.DataFrame
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
    accepted_drafts: int = 0
    drafted: int = 0
    well_filled: float = 0.0
    min_detectable_tvd: float = float("nan")
    alpha: float = 0.05
    verdict: str = "inconclusive"
    reason: str = ""
    rule: str = "token"
    tvd_low: float = float("nan")
    tvd_high: float = float("nan")
    tvd_null: float = float("nan")

    def describe(self) -> str:
        """The verdict with its power: draws, accepted drafts, p-value, TVD and what the test could detect."""
        return (
            f"{self.verdict}: {self.reason}. {self.samples} + {self.samples} samples x {self.max_tokens} tokens; "
            f"{self.accepted_drafts} of {self.drafted} drafted tokens accepted; p = {self.p_value:.3g}, "
            f"TVD = {self.tvd:.3f} [{self.tvd_low:.3f}-{self.tvd_high:.3f}] (noise up to {self.tvd_null:.3f}); "
            f"detectable TVD >= {self.min_detectable_tvd:.3f} "
            f"(alpha {self.alpha:g}, power {POWER:.0%})"
        )


class Sampler:
    """Plain and speculative samples of one prompt from copies of one prefilled prefix, a fresh ``drafter`` per
    speculative sample (``drafted`` / ``accepted``: their draft tokens); an unusable drafter fails here."""

    def __init__(self, model: Any, prompt_ids: Sequence[int], drafter: str, model_name: str | None):
        factories, skipped = usable_drafters([drafter], model, model_name or getattr(model, "specbench_name", None))
        if drafter in skipped:
            raise ValueError(f"drafter {drafter!r} is not usable here: {skipped[drafter]}")
        self.model, self.prompt_ids, self.make = model, prompt_ids, factories[drafter]
        self.prefix, self.drafted, self.accepted = prefix_cache(model, prompt_ids), 0, 0

    def plain(self, options: GenerateOptions, decode: Callable[..., Any] = plain_generation) -> list[int]:
        return list(decode(self.model, self.prompt_ids, options, prompt_cache=cache_copy(self.prefix)))

    def speculative(self, options: GenerateOptions, policy: DraftPolicy, **kwargs: Any) -> list[int]:
        made = self.make()
        kwargs.update(drafter=made, policy=policy, prompt_cache=cache_copy(self.prefix, made))
        gen = speculative_generate(self.model, self.prompt_ids, options, **kwargs)
        tokens, stats = list(gen), gen.stats()
        self.drafted, self.accepted = self.drafted + stats["drafted"], self.accepted + stats["accepted"]
        return tokens


def min_detectable_tvd(n_plain: int, n_speculative: int, alpha: float = 0.05, power: float = POWER) -> float:
    """The smallest total-variation distance the comparison can be expected to find: a shift of mass
    d between two groups of tokens, found by a two-sided two-proportion z-test at ``alpha`` with
    probability ``power`` in the worst case (proportion 1/2), treating tokens as independent draws:
    d = (z(1 - alpha/2) + z(power)) * sqrt(1/n_plain + 1/n_speculative) / 2. Tokens of one sample are
    not independent, so the real threshold is higher: this is a floor."""
    if n_plain < 1 or n_speculative < 1:
        return float("inf")
    z = NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)
    return min(1.0, z * float(np.sqrt(1 / n_plain + 1 / n_speculative)) / 2)


def well_filled_share(plain: Sequence[Sequence[int]], speculative: Sequence[Sequence[int]]) -> float:
    """Share of the pooled sampled tokens whose token's expected count is >= ``MIN_EXPECTED`` in both
    histograms (the chi-square statistic's usual validity rule, per token)."""
    if not any(plain) and not any(speculative):
        return 0.0
    matrix, labels = _histograms(plain, speculative)
    a, b = matrix[~labels].sum(0), matrix[labels].sum(0)
    total = a + b
    expected = np.minimum(total * a.sum(), total * b.sum()) / total.sum()
    return float(total[expected >= MIN_EXPECTED].sum() / total.sum())


def lossless_verdict(p_value: float, accepted_drafts: int, well_filled: float, alpha: float = 0.05) -> tuple[str, str]:
    """("pass" | "fail" | "inconclusive", why). A small p-value is evidence of bias whatever the
    power (the permutation test is exact); a large one means something only if the test had power."""
    if p_value < alpha:
        return "fail", f"the histograms differ (p = {p_value:.3g} < alpha = {alpha:g})"
    if accepted_drafts < MIN_ACCEPTED:
        return "inconclusive", (
            f"only {accepted_drafts} draft tokens were accepted (fewer than {MIN_ACCEPTED}): "
            "the acceptance rule was hardly exercised; sample more or use a prompt the drafter predicts"
        )
    if well_filled < MIN_WELL_FILLED:
        return "inconclusive", (
            f"expected counts too small: only {well_filled:.0%} of sampled tokens have an expected count "
            f">= {MIN_EXPECTED}; sample more or longer"
        )
    return "pass", f"no difference found (p = {p_value:.3g} >= alpha = {alpha:g})"


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
    matrix, labels = _histograms(plain, speculative)
    stat = chi2(matrix[~labels].sum(0), matrix[labels].sum(0))
    rng = np.random.default_rng(seed)
    perms = (rng.permutation(labels) for _ in range(permutations))
    exceed = sum(chi2(matrix[~perm].sum(0), matrix[perm].sum(0)) >= stat for perm in perms)
    return stat, (exceed + 1) / (permutations + 1), _tvd(matrix[~labels].sum(0), matrix[labels].sum(0))


def _histograms(plain: Sequence[Sequence[int]], speculative: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """One row of token counts per sample, over the tokens either set holds; and which rows are speculative."""
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
    return matrix, labels


def _tvd(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a / a.sum() - b / b.sum()).sum())


def tvd_interval(
    plain: Sequence[Sequence[int]],
    speculative: Sequence[Sequence[int]],
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """(low, high, noise) of the pooled token histograms' total variation distance: the bias-corrected percentile
    interval of the TVD over ``resamples`` bootstrap draws of whole samples within each set (a sample's tokens depend
    on each other; it always holds the estimate), and the ``level`` quantile of the TVD with the sets' labels
    permuted (the distance two sets of one distribution show at these sizes; the estimate is biased upwards by it)."""
    matrix, labels = _histograms(plain, speculative)
    rng = np.random.default_rng(seed)
    mine, theirs = matrix[~labels], matrix[labels]
    boot = [
        _tvd(
            mine[rng.integers(len(mine), size=len(mine))].sum(0),
            theirs[rng.integers(len(theirs), size=len(theirs))].sum(0),
        )
        for _ in range(resamples)
    ]
    perms = (rng.permutation(labels) for _ in range(resamples))
    null = [_tvd(matrix[~perm].sum(0), matrix[perm].sum(0)) for perm in perms]
    tail = (1 - level) / 2
    # The plug-in TVD is biased upwards, and its bootstrap more so: the percentile interval is shifted back by the
    # bootstrap's bias (its mean over the estimate) and, at the least, holds the estimate it is the interval of.
    estimate = _tvd(mine.sum(0), theirs.sum(0))
    bias = float(np.mean(boot)) - estimate
    low = max(0.0, min(estimate, float(np.quantile(boot, tail)) - bias))
    high = max(estimate, float(np.quantile(boot, 1 - tail)) - bias)
    return low, high, float(np.quantile(null, level))


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
    alpha: float = 0.05,
    rule: AcceptanceRule | str = "token",
    max_samples: int | None = None,
    detect: float = 0.1,
) -> LosslessCheck:
    """Sample ``samples`` continuations plainly and as many speculatively (other seeds) under ``rule`` and
    compare their token histograms (``LosslessCheck``). ``max_samples``: while the verdict is inconclusive or the
    smallest detectable shift is above ``detect`` (a TVD), sample as many again, up to ``max_samples`` each."""
    policy = as_policy(policy)
    if not temperature > 0:
        raise ValueError("the losslessness check samples: give a temperature > 0")
    rule = rule_for(rule)
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if samples < 2:
        raise ValueError(f"samples must be >= 2, got {samples}")
    if max_samples is not None and max_samples < samples:
        raise ValueError(f"max_samples ({max_samples}) must be at least samples ({samples}), or None not to grow")
    if not 0 < detect <= 1:
        raise ValueError(f"detect is a total-variation distance in (0, 1], got {detect}")
    sampler = Sampler(model, prompt_ids, drafter, model_name)
    plain: list[list[int]] = []
    spec: list[list[int]] = []

    def sample(i: int) -> None:
        # the first ``samples`` as always (plain seed + i, speculative seed + samples + i); grown ones after both
        seeds = (seed + i, seed + samples + i) if i < samples else (seed + 2 * i, seed + 2 * i + 1)
        options = GenerateOptions(max_tokens=max_tokens, temperature=temperature, seed=seeds[0], ignore_eos=True)
        plain.append(sampler.plain(options))
        spec.append(sampler.speculative(replace(options, seed=seeds[1], acceptance_rule=rule), policy))

    target = samples
    while True:
        for i in tqdm(range(len(plain), target), desc="sampling", disable=not progress, leave=False):
            sample(i)
        _, p, tvd = histogram_test(plain, spec, permutations, seed)
        filled = well_filled_share(plain, spec)
        verdict, reason = lossless_verdict(p, sampler.accepted, filled, alpha)
        detectable = min_detectable_tvd(sum(map(len, plain)), sum(map(len, spec)), alpha)
        concluded = verdict == "fail" or (verdict == "pass" and detectable <= detect)
        if max_samples is None or concluded or target >= max_samples:
            break
        target = min(max_samples, 2 * target)
    tvd_low, tvd_high, tvd_null = tvd_interval(plain, spec, permutations, seed)
    matrix, labels = _histograms(plain, spec)
    vocab = sorted({t for s in plain + spec for t in s})
    counts_plain, counts_spec = matrix[~labels].sum(0), matrix[labels].sum(0)
    order = np.argsort(-(counts_plain + counts_spec), kind="stable")[:top]
    tokens = [vocab[i] for i in order]
    texts = [repr(tokenizer.decode([t]))[1:-1] if tokenizer is not None else str(t) for t in tokens]

    def top_then_other(counts: np.ndarray) -> list[int]:
        return [*counts[order].astype(int).tolist(), int(counts.sum() - counts[order].sum())]

    columns = {"token": [*tokens, -1], "text": [*texts, "(other)"]}
    columns |= {"plain": top_then_other(counts_plain), "speculative": top_then_other(counts_spec)}
    counts = pl.DataFrame(columns)
    return LosslessCheck(
        counts,
        p,
        tvd,
        len(plain),
        max_tokens,
        drafter,
        policy.name,
        temperature,
        sampler.accepted / sampler.drafted if sampler.drafted else 0.0,
        plain,
        spec,
        accepted_drafts=sampler.accepted,
        drafted=sampler.drafted,
        well_filled=filled,
        min_detectable_tvd=detectable,
        alpha=alpha,
        verdict=verdict,
        reason=reason,
        rule=rule.label,
        tvd_low=tvd_low,
        tvd_high=tvd_high,
        tvd_null=tvd_null,
    )
