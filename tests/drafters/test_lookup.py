"""Prompt lookup: the path of the latest match, and a tree of several matches' continuations."""

from __future__ import annotations

import pytest
from conftest import build_tiny

from specbench.core.engine import Generation, plain_generation
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.drafters import PromptLookup


def test_lookup_tree_holds_each_distinct_continuation():
    context = [1, 2, 3, 4, 9, 1, 2, 5, 6, 9, 1, 2, 3, 7, 9, 1, 2]
    path = PromptLookup(max_ngram=2)
    path.begin(context)
    assert path.draft(context, 3).tokens == [3, 7, 9]
    tree = PromptLookup(max_ngram=2, tree=True, max_candidates=3)
    tree.begin(context)
    draft = tree.draft(context, 6)
    assert tree.name == "lookup-tree"
    # Latest first: 3 7 9, then 5 6 9, then 3 4 9 (sharing 3): level by level, six nodes.
    assert draft.tokens == [3, 5, 7, 6, 4, 9] and draft.parents == [-1, -1, 0, 1, 0, 2]
    assert tree.draft(context, 2).tokens == [3, 5]
    with pytest.raises(ValueError, match="max_candidates"):
        PromptLookup(tree=True, max_candidates=0)


def test_lookup_tree_decoding_equals_plain_greedy():
    model = build_tiny("qwen3")
    prompt = [3, 4, 5, 6, 3, 4, 7, 8, 3, 4, 5, 9, 3, 4]
    options = GenerateOptions(max_tokens=24)
    plain = list(plain_generation(model, prompt, options))
    gen = Generation(model, prompt, options, drafter=PromptLookup(tree=True), policy=DraftPolicy.fixed(6))
    assert list(gen) == plain
    assert any(r.tree_nodes for r in gen.log)
