"""The n-gram cache drafter: majority successors of cached n-grams, learned across generations; registered alone."""

from __future__ import annotations

import pytest
from conftest import build_tiny

from specbench.core.engine import Generation, plain_generation
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.drafters import PromptLookup, drafter_choices, make_drafter
from specbench.drafters.ngram_cache import NgramCache
from specbench.simulate.simulate import model_free_drafters


def test_each_draft_token_is_the_majority_successor_of_the_longest_cached_tail():
    context = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2]
    cache = NgramCache(max_ngram=2)
    cache.begin(context)
    assert cache.counts[(1, 2)] == {3: 2, 4: 1}
    # (1, 2) -> 3 (twice against once); then (2, 3) -> 1, (3, 1) -> 2, (1, 2) -> 3 again
    assert cache.draft(context, 4).tokens == [3, 1, 2, 3]
    assert NgramCache(max_ngram=2, min_count=3).draft(context, 4).tokens == []  # nothing seen three times
    assert cache.draft([7, 8], 3).tokens == []  # re-learned from an unfollowed context: 8 never had a successor


def test_the_cache_is_shared_across_generations_unlike_prompt_lookup():
    answer = [40, 41, 42, 43, 44, 45, 46, 47]
    cache, lookup = NgramCache(), PromptLookup()
    for drafter in (cache, lookup):
        drafter.begin([1, 2, 3])
        drafter.observe(answer)
        drafter.end()
        drafter.begin([9, 9, 40, 41])  # another request, whose tail began the earlier answer
    assert cache.draft([9, 9, 40, 41], 4).tokens == [42, 43, 44, 45]
    assert lookup.draft([9, 9, 40, 41], 4).tokens == []  # prompt lookup sees this request alone
    small = NgramCache(max_ngrams=3)
    small.begin(answer)
    assert list(small.counts) == [(45, 46), (44, 45, 46), (43, 44, 45, 46)]  # the newest three n-grams kept


def test_bad_arguments_are_one_clear_error():
    with pytest.raises(ValueError, match="max_ngram must be an integer >= 3"):
        NgramCache(min_ngram=3, max_ngram=2)
    with pytest.raises(TypeError, match="min_count"):
        NgramCache(min_count=1.5)


def test_speculative_greedy_equals_plain_greedy_and_the_second_generation_drafts_the_first():
    """Registered by its module alone: make_drafter builds it, --drafter lists it, the simulator replays it."""
    assert "ngram-cache" in drafter_choices() and "ngram-cache" in model_free_drafters()
    model = build_tiny("llama", seed=1)
    options = GenerateOptions(max_tokens=32)
    repetitive = [5, 17, 3, 9, 5, 17, 3, 9, 5, 17, 3, 9, 5, 17]
    other = [11, 29, 2, 60, 33, 8, 71, 14]
    drafter = make_drafter("ngram-cache")
    assert isinstance(drafter, NgramCache)
    stats = []
    for prompt in (repetitive, other, other):
        gen = Generation(model, prompt, options, drafter=drafter, policy=DraftPolicy.fixed(4))
        assert list(gen) == list(plain_generation(model, prompt, options))
        stats.append(gen.stats())
    assert stats[0]["accepted"] > 0  # the repetitive prompt drafts and is accepted
    # the same request again: the cache holds the first answer, so far more of the second is drafted and accepted
    assert stats[2]["accepted"] > stats[1]["accepted"] + 8
