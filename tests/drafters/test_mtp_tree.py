"""MTP token trees: the greedy chain with the head's runners-up as leaves, verified as one tree."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import build_tiny
from mlx.utils import tree_map

from specbench.core.engine import Generation, plain_generation
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.core.tree import depths
from specbench.drafters.mtp import MtpHead
from specbench.models.mtp import build_head

PROMPT = [5, 17, 3, 9, 5, 17, 3, 9, 5, 17, 44, 2, 8]


def test_mtp_tree_decoding_equals_plain_greedy():
    model = build_tiny("llama")
    mx.random.seed(1)
    head = build_head(model)
    head.update(tree_map(lambda p: p * 3 if p.ndim > 1 else p, head.parameters()))
    model.mtp = head
    options = GenerateOptions(max_tokens=30)
    plain = list(plain_generation(model, PROMPT, options))
    drafter = MtpHead(model, tree_width=3)
    gen = Generation(model, PROMPT, options, drafter=drafter, policy=DraftPolicy.fixed(6))
    assert list(gen) == plain
    trees = [r for r in gen.log if r.tree_nodes]
    assert trees[0].tree_nodes == 6 and trees[0].tree_depth == 2
    # The chain's token is each depth's last node: the runners-up before it share its parent.
    assert trees[0].draft_parents == [-1, -1, -1, 2, 2, 2]
    with pytest.raises(ValueError, match="greedily"):
        MtpHead(model, temperature=0.7, tree_width=2)


def _model_with_head(arch: str):
    model = build_tiny(arch)
    mx.random.seed(1)
    head = build_head(model)
    head.update(tree_map(lambda p: p * 3 if p.ndim > 1 else p, head.parameters()))
    model.mtp = head
    return model


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe"])
def test_dynamic_mtp_tree_decoding_equals_plain_greedy(arch):
    model = _model_with_head(arch)
    options = GenerateOptions(max_tokens=24)
    plain = list(plain_generation(model, PROMPT, options))
    drafter = MtpHead(model, top_k=3, tree_depth=4)
    gen = Generation(model, PROMPT, options, drafter=drafter, policy=DraftPolicy.fixed(8))
    assert list(gen) == plain
    trees = [r for r in gen.log if r.kind == "verify" and r.tree_nodes]
    assert trees and all(r.tree_nodes <= 8 for r in trees)
    assert max(r.tree_depth for r in trees) > 1  # the dynamic tree grows past the first level


def _draft(model, drafter: MtpHead, k: int):
    """``drafter``'s draft right after the prompt's first generated token (hidden states from the model)."""
    from specbench.core.verify import forward

    logits, hidden = forward(model, mx.array([PROMPT]), None, return_hidden=True)
    first = int(mx.argmax(logits[0, -1]).item())
    drafter.begin(PROMPT, hidden)
    drafter.observe([first], hidden[:, -1:])
    return drafter.draft(PROMPT + [first], k)


def test_dynamic_mtp_tree_top_1_is_the_greedy_chain():
    model = _model_with_head("qwen3")
    chain = _draft(model, MtpHead(model), 5)
    one = _draft(model, MtpHead(model, top_k=1, tree_depth=5), 5)
    assert one.tokens == chain.tokens and one.parents == [-1, 0, 1, 2, 3]


def test_dynamic_mtp_tree_keeps_the_most_probable_nodes():
    """Scores are cumulative head probabilities: the best first, a child never above its parent, parents
    before children, distinct siblings, at most the budget; each level's nodes come from one head call,
    and the chain's nodes score what the greedy chain's head probabilities multiply to."""
    model = _model_with_head("llama")
    drafter = MtpHead(model, top_k=3, tree_depth=4)
    draft = _draft(model, drafter, 10)
    scores, parents = drafter.last_scores, draft.parents
    assert len(draft.tokens) == len(scores) == len(parents) == 10
    assert scores[0] == max(scores)
    assert all(p < i and scores[i] <= scores[p] + 1e-9 for i, p in enumerate(parents) if p >= 0)
    seen = {(p, t) for p, t in zip(parents, draft.tokens)}
    assert len(seen) == len(parents)
    assert max(depths(parents)) > 1
    # The head calls' speculative cache entries (3 levels expanded, <= 3 rows each) are dropped next draft.
    assert 1 < drafter.speculative <= 3 * 3
