"""scripts.gpu.tree_bench and the oracle tree drafter: timed runs, the verifiers a tree study compares, and
SuffixDecoding's real runs against the simulator's replay."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import build_tiny

from scripts.gpu.tree_bench import suffix_real_row, timed, tree_verifiers
from specbench.core.engine import plain_generation
from specbench.core.options import GenerateOptions
from specbench.drafters.oracle import Oracle, OracleTree
from specbench.exact import ExactVerifier
from specbench.simulate.simulate import Recorded


@pytest.fixture(scope="module")
def model():
    return build_tiny("llama")


def test_oracle_tree_merges_its_drafts_and_stays_exact(model):
    prompt = [5, 9, 13, 5, 9, 13, 5, 9]
    options = GenerateOptions(max_tokens=12)
    plain = list(plain_generation(model, prompt, options))
    recorded = Oracle.from_model(model, prompt, 20, 1.0).recorded
    sure = OracleTree([Oracle(prompt, recorded, 1.0, 64, seed=s) for s in (1, 2)], depth=3)
    sure.begin(prompt)
    draft = sure.draft(prompt, 6)
    assert draft.tokens == recorded[:3] and draft.parents == [-1, 0, 1]  # identical paths merge into one
    unsure = OracleTree([Oracle(prompt, recorded, 0.3, 64, seed=s) for s in (1, 2, 3)], depth=3)
    unsure.begin(prompt)
    tree = unsure.draft(prompt, 9)
    assert 3 <= len(tree.tokens) <= 9 and tree.parents[0] == -1
    verifier = tree_verifiers(model, quick=True, widths=10)["exact"]
    tokens, seconds, stats, gen = timed(model, prompt, options, verifier, OracleTree(unsure.oracles, 3), 9)
    assert tokens == plain and seconds > 0 and stats["verifies"] >= 1
    assert timed(model, prompt, options)[0] == plain


def test_tree_verifiers_are_exact_and_fast(model):
    verifiers = tree_verifiers(model, quick=True, widths=4)
    assert list(verifiers) == ["exact", "fast"] and isinstance(verifiers["exact"], ExactVerifier)


def test_suffix_real_runs_agree_with_the_simulator(model):
    rng = np.random.default_rng(0)
    base = rng.integers(1, 60, 6).tolist()
    turns = []
    for i in range(2):
        prompt = base * 3 + [i + 1]
        output = list(plain_generation(model, prompt, GenerateOptions(max_tokens=8)))
        turns.append(Recorded(prompt, output, "length", id=f"t/{i}"))
    verifier = tree_verifiers(model, quick=True, widths=9)["exact"]
    for tree in (False, True):
        row = suffix_real_row(model, None, turns, verifier, tree, nodes=8, plain_s=1.0, tokens=8)
        assert row["draft"] == ("tree" if tree else "path") and row["turns"] == 2
        assert row["identical"] and row["simulator_agrees"]
        assert row["plain_s"] == 1.0 and row["seconds"] > 0 and row["speedup"] > 0
        assert 0.0 <= row["accepted_per_verify"] <= row["nodes_per_verify"] <= 8
