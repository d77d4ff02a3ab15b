"""SuffixDecoding's back-off trees: Witten-Bell estimates against brute-force counts, the path as spine."""

from __future__ import annotations

import random

import pytest
from test_suffix import markov

from specbench.core.tree import check_siblings, depths, is_path
from specbench.drafters import SuffixDecoding
from specbench.drafters.suffix_backoff import backoff_distribution
from specbench.drafters.suffix_index import SuffixIndex


def naive_backoff(seq: list[int], pattern: list[int], matched: int) -> dict[int, float]:
    """Witten-Bell over the match lengths 1..matched of ``pattern`` in ``seq``, one level per distinct
    set of end positions (the automaton's states), shortest first."""
    levels, previous = [], None
    for length in range(1, matched + 1):
        s = pattern[len(pattern) - length :]
        ends = tuple(i for i in range(length - 1, len(seq)) if seq[i - length + 1 : i + 1] == s)
        if ends == previous:
            continue  # the same state: one level
        previous = ends
        counts: dict[int, int] = {}
        for i in ends:
            if i + 1 < len(seq):
                counts[seq[i + 1]] = counts.get(seq[i + 1], 0) + 1
        levels.append(counts)
    # Lengths that share a state are merged above; the longest state's level is the last one.
    probs: dict[int, float] = {}
    for counts in levels:
        if not counts:
            continue
        total, distinct = sum(counts.values()), len(counts)
        probs = {t: p * distinct / (total + distinct) for t, p in probs.items()}
        for t, c in counts.items():
            probs[t] = probs.get(t, 0.0) + c / (total + distinct)
    return probs


@pytest.mark.parametrize("seed", range(4))
def test_backoff_distribution_is_witten_bell_over_the_suffix_chain(seed):
    rng = random.Random(seed)
    seq = markov(rng, 150, rng.choice([3, 6, 20]), copy_prob=0.1)
    index = SuffixIndex(64)
    index.start_sequence()
    index.extend(seq)
    for _ in range(20):
        end = rng.randrange(5, len(seq))
        pattern = seq[end - rng.randint(2, 12) : end]
        state, matched = index.match(pattern)
        if not matched:
            continue
        got = backoff_distribution(index, state)
        want = naive_backoff(seq, pattern, matched)
        assert got.keys() == want.keys()
        assert [got[t] for t in want] == pytest.approx(list(want.values()))
        assert sum(got.values()) <= 1 + 1e-9


@pytest.mark.parametrize("seed", range(3))
def test_backoff_tree_keeps_the_path_as_spine_within_the_budget(seed):
    rng = random.Random(seed)
    settings = dict(max_depth=rng.choice([8, 64]), max_spec_factor=rng.choice([0.5, 1.0, 2.0]), min_token_prob=0.1)
    tree, path = SuffixDecoding(tree=True, **settings), SuffixDecoding(**settings)
    seq = markov(rng, 160, rng.choice([3, 6, 50]), copy_prob=0.1)
    stored = markov(rng, 80, 6, copy_prob=0.1)
    for d in (tree, path):
        d.remember(stored)
        d.begin(seq[:20])
    branched = 0
    for n in range(20, len(seq)):
        k = rng.randint(1, 16)
        got, spine = tree.draft(seq[:n], k), path.draft(seq[:n], k).tokens
        parents = got.parents if got.parents is not None else list(range(-1, len(got.tokens) - 1))
        assert got.tokens[: len(spine)] == spine and parents[: len(spine)] == list(range(-1, len(spine) - 1))
        assert len(got.tokens) <= min(k, tree.max_spec_tokens)
        assert bool(got.tokens) == bool(spine)
        check_siblings(got.tokens, parents)
        assert not got.tokens or max(depths(parents)) < tree.max_depth
        branched += got.parents is not None
        for d in (tree, path):
            d.observe([seq[n]])
    assert branched > 0


def test_backoff_tree_branches_where_shorter_matches_disagree():
    # The longest match "5 1 2" was seen once (followed by 3); the shorter "1 2" was also followed by 7.
    context = [1, 2, 7, 8, 5, 1, 2, 3, 4, 9, 5, 1, 2]
    drafter = SuffixDecoding(tree=True, use_global=False, min_token_prob=0.1)
    drafter.begin(context)
    draft = drafter.draft(context, 8)
    assert draft.tokens[0] == 3 and draft.parents is not None
    assert {draft.tokens[i] for i, p in enumerate(draft.parents) if p == -1} == {3, 7}
    reference = SuffixDecoding(tree="reference", use_global=False, min_token_prob=0.1)
    reference.begin(context)
    assert is_path(reference.draft(context, 8).parents)  # the reference's tree from one match is a path here
