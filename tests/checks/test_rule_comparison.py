"""The rule comparison: exact match's acceptance against its expectation, typical's distribution shift with
its interval, and the sweep's summary and best lossless rule per temperature."""

from __future__ import annotations

import mlx.core as mx
import polars as pl
import pytest
from conftest import build_tiny

from specbench.bench.sweep import run_sweep
from specbench.checks.acceptance_rules import (
    best_lossless,
    exact_match_expectation,
    rule_list,
    rule_shifts,
    rule_summary,
    run_rule_sweep,
    shift_table,
)
from specbench.core.draft import Draft, Drafter
from specbench.core.rules import ExactMatch
from specbench.inputs.prompts import Prompt
from specbench.report import verdicts

VOCAB = 5
REPEATING = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]


@pytest.fixture(scope="module")
def small_vocab_model():
    return build_tiny("llama", seed=3, scale=1.5, vocab_size=VOCAB)


class ModelGreedy(Drafter):
    """Drafts the target's own greedy continuation (deterministic, q one-hot): accepted about p(argmax)."""

    name = "model-greedy"

    def __init__(self, model):
        self.model = model

    def draft(self, context, k):
        tokens = list(context)
        for _ in range(k):
            tokens.append(int(mx.argmax(self.model(mx.array([tokens]))[0, -1]).item()))
        return Draft(tokens[len(context) :])


def test_exact_match_accepts_with_the_target_probability_of_each_drafted_token(small_vocab_model):
    sweep = run_sweep(
        small_vocab_model,
        None,
        [REPEATING],
        drafters=[],
        policies=[3],
        max_tokens=24,
        temperatures=[1.0],
        seeds=list(range(25)),
        ignore_eos=True,
        progress=False,
        drafter_factories={"model-greedy": lambda: ModelGreedy(small_vocab_model)},
        rules=[ExactMatch()],
        warmup_tokens=0,
    )
    check = exact_match_expectation(sweep.steps)
    assert check["reached_positions"] >= 150
    assert 0 < check["measured"] < check["reached_positions"]
    assert check["low"] <= check["measured"] <= check["high"], check
    assert check["high"] - check["low"] < 0.3 * check["expected"]  # an interval narrow enough to mean something
    assert exact_match_expectation(sweep.steps.filter(pl.col("kind") != "verify"))["reached_positions"] == 0


def test_typical_shifts_the_distribution_and_the_token_rule_does_not(small_vocab_model):
    checks = rule_shifts(
        small_vocab_model,
        None,
        REPEATING,
        rule_list(["token", "typical"]),
        drafter="lookup",
        policy=3,
        samples=150,
        max_tokens=6,
        permutations=300,
        progress=False,
    )
    table = shift_table(checks)
    token, typical = table.row(0, named=True), table.row(1, named=True)
    assert typical["acceptance"] == "typical (lossy)" and token["acceptance"] == "token"
    assert typical["verdict"] == "fail" and typical["p_value"] < 0.01
    assert 0 < typical["tvd_low"] <= typical["tvd"] <= typical["tvd_high"]
    assert typical["tvd"] > typical["tvd_noise"] and typical["tvd_low"] > token["tvd_low"]
    assert token["verdict"] != "fail" and token["accepted_drafts"] > 20
    assert token["tvd_low"] <= token["tvd"] <= token["tvd_high"]


def test_rule_sweep_summary_and_verdict():
    model = build_tiny("llama", seed=1)
    prompts = [Prompt("p0", "custom", "", [5, 17, 3, 9, 5, 17, 3, 9, 5, 17])]
    sweep = run_rule_sweep(
        model,
        None,
        prompts,
        rule_list(["token", "exact-match", "block", "typical"]),
        drafters=["lookup", "draft-model"],
        draft_lengths=[2],
        temperatures=[0.7, 1.0],
        max_tokens=10,
        progress=False,
        drafter_factories={"model-greedy": lambda: ModelGreedy(model)},
    )
    assert "draft-model" in sweep.skipped  # no shipped draft for a random tiny model
    assert set(sweep.runs["acceptance"].unique()) == {"none", "token", "exact-match", "block", "typical (lossy)"}
    assert set(sweep.steps["acceptance"].unique()) >= {"block", "typical (lossy)"}
    summary = rule_summary(sweep)
    assert set(sweep.runs["drafter"].unique()) == {"none", "lookup", "model-greedy"}
    assert len(summary) == 8 and summary.filter(pl.col("acceptance") == "typical (lossy)")["lossless"].to_list() == [
        False,
        False,
    ]
    best = best_lossless(summary)
    assert best["temperature"].to_list() == [0.7, 1.0]
    assert set(best["acceptance"]) <= {"token", "exact-match", "block"}
    text = verdicts.acceptance_rules(summary, best)
    assert "T = 0.7" in text and "T = 1" in text and "tokens per verification" in text
    with pytest.raises(ValueError, match="temperatures > 0"):
        run_rule_sweep(model, None, prompts, rule_list(), temperatures=[0.0])
    with pytest.raises(ValueError, match="acceptance_rule must be one of"):
        rule_list(["tokenwise"])


def test_the_tvd_interval_holds_its_estimate():
    """Two small sets from one distribution: the plug-in TVD is biased upwards and its plain percentile interval can
    lie wholly above it ("TVD = 0.217 [0.233-0.383]"); the bias-corrected interval holds it, at every seed."""
    import numpy as np

    from specbench.checks.lossless import _histograms, _tvd, tvd_interval

    rng = np.random.default_rng(5)
    for seed in range(10):
        plain = [list(rng.integers(0, 40, size=4)) for _ in range(8)]
        spec = [list(rng.integers(0, 40, size=4)) for _ in range(8)]
        matrix, labels = _histograms(plain, spec)
        estimate = _tvd(matrix[~labels].sum(0), matrix[labels].sum(0))
        low, high, noise = tvd_interval(plain, spec, resamples=400, seed=seed)
        assert 0.0 <= low <= estimate <= high, (seed, low, estimate, high)
        assert noise > 0
