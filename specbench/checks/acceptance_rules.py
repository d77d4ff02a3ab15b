"""Acceptance rules compared on the same model, drafters, prompts and draft lengths when sampling: what each rule
buys per verification (``run_rule_sweep``, ``rule_summary``, ``best_lossless``) and how far it shifts the token
distribution (``rule_shifts``, ``exact_match_expectation``). The draft model drafts with its own distribution q at
each temperature; lookup, suffix and the MTP head draft their argmax (q one-hot).
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import polars as pl

from specbench.bench.sweep import Sweep, merged_cells, run_sweep, summarize_sweep
from specbench.checks.lossless import LosslessCheck, losslessness_check
from specbench.core.accept import SamplingSettings
from specbench.core.policies import DraftPolicy
from specbench.core.rules import AcceptanceRule, rule_for, rule_names
from specbench.drafters import DraftModel, shipped_draft_model
from specbench.inputs.capabilities import usable_drafters
from specbench.inputs.prompts import Prompt


def rule_list(names: Sequence[str] | None = None, parameters: dict[str, dict] | None = None) -> list[AcceptanceRule]:
    """The rules named (default: every registered one), each checked (an unknown name is one clear error), with
    ``parameters`` by rule name (``{"typical": {"epsilon": 0.09, "delta": 0.3}}``; defaults for the rest)."""
    names = rule_names() if names is None else names
    if not names:
        raise ValueError(f"no acceptance rules given: name some of {', '.join(rule_names())}")
    unused = sorted(set(parameters or {}) - set(names))
    if unused:
        raise ValueError(f"parameters given for rules not chosen: {', '.join(unused)}")
    return [rule_for(name, **(parameters or {}).get(name, {})) for name in names]


def run_rule_sweep(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Prompt],
    rules: Sequence[AcceptanceRule],
    drafters: Sequence[str] = ("lookup", "suffix", "mtp", "draft-model"),
    draft_lengths: Sequence[int] = (2, 4),
    temperatures: Sequence[float] = (0.3, 0.7, 1.0),
    seeds: Sequence[int] = (0,),
    max_tokens: int = 32,
    model_name: str | None = None,
    progress: bool = True,
    drafter_factories: dict[str, Any] | None = None,
) -> Sweep:
    """Every prompt at every temperature and seed: plain, then each rule x drafter x fixed draft length
    (``Sweep.runs`` has an ``acceptance`` column). Drafters the model cannot use are in ``skipped``;
    ``drafter_factories`` adds drafters of your own (name -> a function building a fresh one)."""
    if not temperatures or any(t <= 0 for t in temperatures):
        raise ValueError(f"the rules differ only when sampling: give temperatures > 0, got {list(temperatures)}")
    name = model_name or getattr(model, "specbench_name", None)
    parts: list[Sweep] = []
    for temperature in temperatures:
        own: dict[str, Any] = dict(drafter_factories or {})
        if "draft-model" in drafters and not usable_drafters(["draft-model"], model, name)[1]:
            draft = shipped_draft_model(model, name)
            settings = SamplingSettings(float(temperature))
            own["draft-model"] = lambda draft=draft, settings=settings: DraftModel(
                draft, target=model, sampling=settings
            )
        parts.append(
            run_sweep(
                model,
                tokenizer,
                prompts,
                [d for d in drafters if d not in own],
                [DraftPolicy.fixed(int(k)) for k in draft_lengths],
                max_tokens=max_tokens,
                temperatures=[float(temperature)],
                seeds=seeds,
                model_name=name,
                ignore_eos=True,
                progress=progress,
                drafter_factories=own,
                rules=rules,
            )
        )
    runs, steps = merged_cells({i: (part.runs.to_dicts(), part.steps) for i, part in enumerate(parts)})
    return Sweep(runs, steps, {name: why for part in parts for name, why in part.skipped.items()})


def rule_summary(sweep: Sweep, by: Sequence[str] = ("temperature", "acceptance")) -> pl.DataFrame:
    """Speculative runs aggregated per ``by`` (ratios of sums): tokens per verification, acceptance rate,
    speedup over plain decoding, with ``lossless`` saying whether the rule keeps plain sampling's distribution."""
    runs = sweep.runs.filter(pl.col("drafter") != "none")
    if runs.is_empty():
        raise ValueError("the sweep has no speculative runs (every drafter skipped?)")
    lossless = {rule.label: rule.lossless for rule in rule_list()}
    return (
        summarize_sweep(runs, by)
        .with_columns(pl.col("acceptance").replace_strict(lossless, return_dtype=pl.Boolean).alias("lossless"))
        .sort(list(by))
    )


def best_lossless(summary: pl.DataFrame) -> pl.DataFrame:
    """Per temperature, the lossless rule with the most tokens per verification (the rules share the
    verification forward, so this is what a rule changes), with its speedup; ties keep rule order."""
    rows = summary.filter(pl.col("lossless") & pl.col("tokens_per_verify").is_not_null())
    order = {rule.label: i for i, rule in enumerate(rule_list())}
    return (
        rows.with_columns(pl.col("acceptance").replace_strict(order, return_dtype=pl.Int64).alias("_order"))
        .sort(["temperature", "tokens_per_verify", "_order"], descending=[False, True, False])
        .group_by("temperature", maintain_order=True)
        .first()
        .drop("_order")
        .select("temperature", "acceptance", "tokens_per_verify", "acceptance_rate", "speedup")
    )


def exact_match_expectation(steps: pl.DataFrame, level: float = 0.95) -> dict[str, float]:
    """Exact match accepts a reached draft token with the target's probability of it, p(x): over the
    verifications of exact-match runs, the accepted tokens measured against their expected count, the sum
    of p(x) over every reached draft position (the accepted ones and the first rejected one), with the
    interval expected +- z * sqrt(sum p(1 - p)) (a sum of Bernoulli trials, each reached only after the ones
    before it succeeded: a martingale, so the normal interval holds). No reached position: zeros, a NaN interval."""
    rows = steps.filter((pl.col("acceptance") == "exact-match") & (pl.col("kind") == "verify"))
    reached = rows.select(pl.col("accept_probs").list.head(pl.col("accepted") + 1).explode()).to_series().drop_nulls()
    measured, positions = int(rows["accepted"].sum()), len(reached)
    expected, variance = float(reached.sum()), float((reached * (1 - reached)).sum())
    half = NormalDist().inv_cdf(0.5 + level / 2) * variance**0.5 if positions else float("nan")
    return {
        "measured": float(measured),
        "expected": expected,
        "low": expected - half,
        "high": expected + half,
        "reached_positions": float(positions),
    }


def rule_shifts(
    model: Any, tokenizer: Any, prompt_ids: Sequence[int], rules: Sequence[AcceptanceRule], **options: Any
) -> list[LosslessCheck]:
    """Plain against speculative sampling from one prompt, once per rule (``losslessness_check`` with ``options``:
    drafter, policy, temperature, samples, ...): the histogram test and the total variation distance with its
    interval and noise level."""
    return [losslessness_check(model, tokenizer, prompt_ids, rule=rule, **options) for rule in rules]


def shift_table(checks: Sequence[LosslessCheck], summary: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per rule: verdict ("fail": the histograms differ, p < alpha), p-value, TVD [its bootstrap
    interval], the TVD two samples of one distribution show at these sizes (``tvd_noise``: the estimate
    is biased upwards by about that much), accepted drafts; with ``summary`` (``rule_summary``), the rule's speedup and
    tokens per verification at the checks' temperature beside its shift."""
    fields = "rule temperature verdict p_value tvd tvd_low tvd_high tvd_null accepted_drafts acceptance_rate".split()
    table = pl.DataFrame({name: [getattr(c, name) for c in checks] for name in fields})
    table = table.rename({"rule": "acceptance", "tvd_null": "tvd_noise"})
    table = table.with_columns(pl.col("temperature").cast(pl.Float64))
    if summary is None:
        return table
    beside = summary.select("temperature", "acceptance", "tokens_per_verify", "speedup")
    return table.join(beside, on=["temperature", "acceptance"], how="left")
