"""MTP token trees: the greedy chain with the head's runners-up as leaves, verified as one tree."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import build_tiny
from mlx.utils import tree_map

from specbench.core.engine import Generation, generate
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.drafters.mtp import MtpDrafter
from specbench.models.mtp import build_head

PROMPT = [5, 17, 3, 9, 5, 17, 3, 9, 5, 17, 44, 2, 8]


def test_mtp_tree_decoding_equals_plain_greedy():
    model = build_tiny("llama")
    mx.random.seed(1)
    head = build_head(model)
    head.update(tree_map(lambda p: p * 3 if p.ndim > 1 else p, head.parameters()))
    model.mtp = head
    options = GenerateOptions(max_tokens=30)
    plain = list(generate(model, PROMPT, options))
    drafter = MtpDrafter(model, tree_width=3)
    gen = Generation(model, PROMPT, options, drafter=drafter, policy=DraftPolicy.fixed(6))
    assert list(gen) == plain
    trees = [r for r in gen.log if r["tree_nodes"]]
    assert trees[0]["tree_nodes"] == 6 and trees[0]["tree_depth"] == 2
    # The chain's token is each depth's last node: the runners-up before it share its parent.
    assert trees[0]["draft_parents"] == [-1, -1, -1, 2, 2, 2]
    with pytest.raises(ValueError, match="greedily"):
        MtpDrafter(model, temperature=0.7, tree_width=2)
