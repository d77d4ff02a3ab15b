"""SuffixDecoding's speculation trees against a brute-force transcription of the reference's tree."""

from __future__ import annotations

import heapq
import random

import pytest
from test_suffix import NaiveTree, markov

from specbench.core.tree import depths
from specbench.drafters import SuffixDecoding


def naive_tree(tree: NaiveTree, pattern, max_spec, factor, offset, min_prob) -> tuple[float, list[float], int]:
    """The reference's best tree over match lengths: (score, node probabilities sorted, match length).

    Best-first expansion takes the ``budget`` most probable nodes (a child is never more probable than
    its parent), so the probabilities and the score do not depend on how ties are broken."""
    pattern = list(pattern)[-tree.depth :]
    best: tuple[float, list[float], int] = (0.0, [], 0)
    for m in range(1, len(pattern)):
        s = tuple(pattern[-m:])
        if not tree.count.get(s):
            break
        budget = max(0, min(max_spec, int(m * factor + offset + 1e-6)))
        heap, probs, order = [(-1.0, 0, s)], [], 0
        while heap and len(probs) < budget:
            neg, _, node = heapq.heappop(heap)
            if node != s:
                probs.append(-neg)
            if len(node) >= tree.depth:
                continue
            for child in tree.children.get(node, ()):
                prob = -neg * tree.count[child] / tree.count[node]
                if prob >= min_prob:
                    order += 1
                    heapq.heappush(heap, (-prob, order, child))
        if sum(probs) >= best[0]:
            best = (sum(probs), sorted(probs), m)
    return best


def node_probs(tree: NaiveTree, context, tokens, parents, match) -> list[float]:
    """Each drafted node's probability, read from the brute-force counts (its path must occur)."""
    base = tuple(context[len(context) - match :])
    strings, probs = [], []
    for t, p in zip(tokens, parents):
        parent = base if p < 0 else strings[p]
        child = parent + (t,)
        assert tree.count.get(child), (child, "does not occur")
        probs.append((1.0 if p < 0 else probs[p]) * tree.count[child] / tree.count[parent])
        strings.append(child)
    return probs


@pytest.mark.parametrize("seed", range(5))
def test_local_trees_match_reference(seed):
    rng = random.Random(seed)
    depth = rng.choice([4, 8, 64])
    max_spec = rng.choice([1, 4, 16])
    factor = rng.choice([0.5, 1.0, 2.0])
    min_prob = rng.choice([0.0, 0.1, 0.3])
    drafter = SuffixDecoding(
        max_depth=depth, max_spec_tokens=max_spec, max_spec_factor=factor, min_token_prob=min_prob, use_global=False
    )
    drafter.tree, drafter.tree_rule = True, "reference"  # SuffixDecoding(tree="reference") with these settings
    drafter._limits.clear()
    seq = markov(rng, 200, rng.choice([3, 6, 50]), copy_prob=0.1)
    drafter.begin(seq[:20])
    local = NaiveTree([seq[:20]], depth)
    for n in range(20, len(seq)):
        k = rng.randint(1, 20)
        got = drafter.draft(seq[:n], k)
        score, probs, match = naive_tree(local, seq[:n], min(k, max_spec), factor, 0.0, min_prob)
        parents = got.parents if got.parents is not None else list(range(-1, len(got.tokens) - 1))
        assert drafter.last_draft["match"] == (match if probs else 0)
        assert sorted(node_probs(local, seq[:n], got.tokens, parents, match)) == pytest.approx(probs), n
        assert drafter.last_draft["score"] == pytest.approx(score)
        assert not got.tokens or max(depths(parents)) + match <= depth
        drafter.observe([seq[n]])
        local.append(seq[n])


def test_tree_branches_where_the_path_picks_one_continuation():
    drafter = SuffixDecoding(tree=True, use_global=False, max_spec_factor=4.0, min_token_prob=0.1)
    # "1 2" was followed by 3 twice and by 7 once: the tree holds both branches.
    context = [1, 2, 3, 4, 1, 2, 7, 8, 1, 2, 3, 4, 9, 1, 2]
    drafter.begin(context)
    draft = drafter.draft(context, 16)
    assert drafter.name == "suffix-tree"
    assert draft.parents is not None
    firsts = {draft.tokens[i] for i, p in enumerate(draft.parents) if p == -1}
    assert firsts == {3, 7}
    path = SuffixDecoding(use_global=False, max_spec_factor=4.0, min_token_prob=0.1)
    path.begin(context)
    assert path.draft(context, 16).tokens[0] == 3
    reference = SuffixDecoding(tree="reference", use_global=False, max_spec_factor=4.0, min_token_prob=0.1)
    reference.begin(context)
    draft = reference.draft(context, 16)
    assert {draft.tokens[i] for i, p in enumerate(draft.parents) if p == -1} == {3, 7}
    assert reference.last_draft["score"] > path.last_draft["score"]


def test_tree_drafts_share_the_global_store():
    drafter = SuffixDecoding(tree=True, max_spec_factor=2.0)
    for response in ([10, 11, 12, 13, 14], [10, 11, 20, 21, 22]):
        drafter.begin([1])
        drafter.observe(response)
        drafter.end()
    drafter.begin([5, 10, 11])
    draft = drafter.draft([5, 10, 11], 8)
    assert drafter.last_draft["source"] == "global"
    assert {draft.tokens[i] for i, p in enumerate(draft.parents) if p == -1} == {12, 20}


def test_tree_decoding_equals_plain_and_the_simulator_agrees_step_by_step():
    from conftest import build_tiny

    from specbench.core.engine import Generation
    from specbench.core.options import GenerateOptions
    from specbench.core.policies import DraftPolicy
    from specbench.simulate.simulate import record, simulate

    model = build_tiny("llama")
    prompt = [3, 4, 5, 6, 3, 4, 7, 8, 3, 4, 5, 9, 3, 4, 7, 10, 3, 4]  # "3 4" goes on two ways
    options = GenerateOptions(max_tokens=30)
    settings = dict(max_spec_factor=4.0, min_token_prob=0.0)
    (recorded,) = record(model, [prompt], options)
    real = Generation(
        model, prompt, options, drafter=SuffixDecoding(tree=True, **settings), policy=DraftPolicy.fixed(8)
    )
    assert list(real) == recorded.output
    simulated = simulate([recorded], SuffixDecoding(tree=True, **settings), DraftPolicy.fixed(8), options)
    keys = ("kind", "accepted", "emitted", "tree_nodes", "accepted_path", "tokens", "draft_parents")
    assert [[getattr(r, k) for k in keys] for r in simulated] == [[getattr(r, k) for k in keys] for r in real.log]
    assert any(r.tree_nodes > 0 for r in real.log)
