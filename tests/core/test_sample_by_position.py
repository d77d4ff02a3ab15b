"""Sampling by position: with one seed, speculative sampling gives plain sampling's tokens, token for token, on
paths, trees and batches, for the rules that can ("exact-match" always; "token" and "block" with deterministic
drafts); the rule that cannot ("typical") and the drafts that cannot ("token"/"block" with q) are refused."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import ScriptedDrafter, build_tiny
from scipy.stats import chisquare

from specbench import Draft, Drafter, DraftPolicy, GenerateOptions, speculative_generate_batch
from specbench.bench.turn_cache import first_divergence
from specbench.checks.same_tokens import same_tokens_check
from specbench.core.accept import SamplingSettings, draw_by_position
from specbench.core.batch import BatchGeneration, generate_batch
from specbench.core.engine import Generation, plain_generation
from specbench.drafters import DraftModel
from specbench.exact import ExactVerifier
from specbench.kernels.probe import cuda_available

PROMPT = [5, 9, 13, 2, 7, 5, 9, 13, 2, 7, 5, 9]
RUNS = 12


@pytest.fixture(scope="module")
def model():
    return build_tiny("llama", seed=3, scale=1.5)


def by_position(seed: int, max_tokens: int = 20, acceptance: str = "token", **fields) -> GenerateOptions:
    fields = {"temperature": 1.0, **fields}
    return GenerateOptions(
        max_tokens=max_tokens, seed=seed, ignore_eos=True, acceptance_rule=acceptance, sample_by_position=True, **fields
    )


def test_a_draw_by_position_is_distributed_as_p_and_depends_on_seed_and_position_alone():
    p = mx.array([[0.05, 0.4, 0.25, 0.2, 0.1]])
    tokens = [int(draw_by_position(p, 7, [i])[0].item()) for i in range(3000)]
    observed = np.bincount(tokens, minlength=5)
    assert chisquare(observed, np.array(p[0]) * len(tokens)).pvalue > 1e-3
    rows = mx.concatenate([p, mx.array([[0.2] * 5]), p])
    # a row's token is the one it gets alone, whatever rows stand beside it
    assert draw_by_position(rows, 7, [40, 3, 41]).tolist() == [
        int(draw_by_position(p, 7, [40])[0].item()),
        int(draw_by_position(rows[1:2], 7, [3])[0].item()),
        int(draw_by_position(p, 7, [41])[0].item()),
    ]
    assert [int(draw_by_position(p, s, [0])[0].item()) for s in range(40)] != tokens[:1] * 40


def test_plain_sampling_by_position_repeats_and_differs_from_the_stream(model):
    once = list(plain_generation(model, PROMPT, by_position(3)))
    assert list(plain_generation(model, PROMPT, by_position(3))) == once
    assert list(plain_generation(model, PROMPT, by_position(4))) != once
    stream = GenerateOptions(max_tokens=20, temperature=1.0, seed=3, ignore_eos=True)
    # as reproducible as before
    assert list(plain_generation(model, PROMPT, stream)) == list(plain_generation(model, PROMPT, stream))


@pytest.mark.parametrize("acceptance", ["token", "exact-match", "block"])
def test_speculative_paths_give_plain_sampling_tokens(model, acceptance):
    """Lookup drafts (deterministic), exact verification by default: every run the same; one random stream per run
    instead differs on most runs (what the check would see if the draws were not keyed by position)."""
    run = dict(runs=RUNS, max_tokens=24, rule=acceptance, progress=False)
    check = same_tokens_check(model, PROMPT, "lookup", "fixed:4", **run)
    assert check.verify == "exact"
    assert check.same == RUNS, check.frame().filter(~check.frame()["same"])
    assert check.accepted_drafts >= 8 and check.accepted_drafts < check.drafted  # accepted and rejected drafts
    stream = same_tokens_check(model, PROMPT, "lookup", "fixed:4", sample_by_position=False, **run)
    assert stream.same < RUNS // 2


def test_speculative_paths_give_plain_sampling_tokens_on_a_moe_with_scripted_drafts():
    """With the sampler's filters too (top-p, top-k, min-p, another temperature): a draw is made from p as filtered."""
    moe = build_tiny("qwen3_moe")
    verifier = ExactVerifier(moe, level="all")
    filters = [{}, dict(top_p=0.9), dict(top_k=20, temperature=0.7), dict(min_p=0.05)]
    for seed in range(8):
        options = by_position(seed, **filters[seed % 4])
        plain = list(plain_generation(moe, PROMPT, options))
        drafter = ScriptedDrafter(plain, len(PROMPT), 97, wrong_at=lambda step, i: (step + i) % 3 == 2)
        gen = Generation(moe, PROMPT, options, drafter=drafter, policy=DraftPolicy.fixed(4), verifier=verifier)
        assert list(gen) == plain
        assert 0 < gen.stats()["accepted"] < gen.stats()["drafted"]


class SampledDrafter(Drafter):
    """Drafts sampled from a fixed q over the tiny vocabulary, with q (``Draft.probs``)."""

    name = "sampled"

    def __init__(self, vocab: int = 97):
        self.q = mx.softmax(mx.arange(vocab, dtype=mx.float32) % 7, axis=-1)

    def draft(self, context, k):
        tokens = mx.random.categorical(mx.log(self.q), shape=(k,)).tolist()
        return Draft(tokens, mx.broadcast_to(self.q, (k, self.q.shape[0])))


def test_exact_match_gives_plain_sampling_tokens_with_drafts_sampled_from_q(model):
    verifier = ExactVerifier(model, level="all")
    for seed in range(6):
        options = by_position(seed, acceptance="exact-match")
        plain = list(plain_generation(model, PROMPT, options))
        gen = Generation(
            model, PROMPT, options, drafter=SampledDrafter(), policy=DraftPolicy.fixed(3), verifier=verifier
        )
        assert list(gen) == plain


class TruthTree(Drafter):
    """Two chains of three nodes under the root and a wrong leaf under the first node of each: the true
    continuation down one chain to a depth that cycles, wrong tokens elsewhere (every sibling distinct)."""

    name = "truth-tree"

    def __init__(self, truth: list[int], prompt_len: int):
        self.truth, self.prompt_len, self.calls = truth, prompt_len, 0

    def draft(self, context, k):
        done = len(context) - self.prompt_len
        true = (self.truth[done : done + 3] + [1, 1, 1])[:3]
        branch, depth = self.calls % 2, (self.calls // 2) % 4
        self.calls += 1
        tokens, parents = [], []
        for b in range(2):
            parent = -1
            for d in range(3):
                good = b == branch and d < depth
                tokens.append(true[d] if good else (true[d] + 1 + b + (d == 0 and b > branch)) % 97)
                parents.append(parent)
                parent = len(tokens) - 1
            tokens.append((true[1] + 7 + b) % 97)
            parents.append(len(tokens) - 3)
        return Draft(tokens, parents=parents)


@pytest.mark.parametrize("acceptance", ["token", "exact-match"])
def test_speculative_trees_give_plain_sampling_tokens(model, acceptance):
    verifier = ExactVerifier(model, level="attention")
    accepted_off_first_branch = False
    for seed in range(8):
        options = by_position(seed, acceptance=acceptance)
        plain = list(plain_generation(model, PROMPT, options))
        gen = Generation(
            model,
            PROMPT,
            options,
            drafter=TruthTree(plain, len(PROMPT)),
            policy=DraftPolicy.fixed(8),
            verifier=verifier,
        )
        assert list(gen) == plain
        accepted_off_first_branch |= any(r.accepted_path and r.accepted_path[0] > 0 for r in gen.log)
    assert accepted_off_first_branch


@pytest.mark.parametrize("acceptance", ["token", "exact-match", "block"])
def test_batched_sampling_gives_each_request_its_plain_sampling_tokens(model, acceptance):
    prompts = [PROMPT, [3, 8, 3, 8, 3, 8, 3], [11, 4, 60, 2], [1, 2, 3, 1, 2, 3, 1, 2]]
    options = [by_position(10 + i, max_tokens=16, acceptance=acceptance) for i in range(len(prompts))]
    truth = [list(plain_generation(model, p, o)) for p, o in zip(prompts, options)]
    assert generate_batch(model, prompts, options).run() == truth
    drafters = [
        ScriptedDrafter(t, len(p), 97, wrong_at=lambda step, i, r=r: (step + i + r) % 3 == 2)
        for r, (p, t) in enumerate(zip(prompts, truth))
    ]
    gen = speculative_generate_batch(
        model, prompts, options, drafters=drafters, policy=DraftPolicy.fixed(4), max_batch=3, progress=None
    )
    assert gen.run() == truth
    assert all(0 < r.stats()["accepted"] < r.stats()["drafted"] for r in gen.requests)


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            dict(acceptance_rule="typical"),
            r"acceptance 'typical' cannot give plain sampling's tokens .*use 'exact-match'",
        ),
        (dict(seed=None), r"sample_by_position keys each token's draw by \(seed, position\): give a seed"),
        (dict(sample_by_position=1), r"sample_by_position must be True or False"),
    ],
)
def test_what_cannot_give_plain_sampling_tokens_is_one_clear_error_before_model_work(no_forward, fields, message):
    options = by_position(0)
    for name, value in fields.items():
        setattr(options, name, value)
    with pytest.raises((ValueError, TypeError), match=message):
        Generation(no_forward, PROMPT, options, drafter=SampledDrafter(), policy=DraftPolicy.fixed(3))
    with pytest.raises((ValueError, TypeError), match=message):
        plain_generation(no_forward, PROMPT, options)


@pytest.mark.parametrize("acceptance", ["token", "block"])
def test_a_sampling_draft_model_with_token_or_block_is_refused_before_model_work(no_forward, acceptance):
    draft = build_tiny("llama", seed=9, num_hidden_layers=1)
    drafter = DraftModel(draft, target=no_forward, sampling=SamplingSettings(temperature=1.0))
    with pytest.raises(ValueError, match=rf"acceptance '{acceptance}' cannot give plain .* drafts sampled from q"):
        Generation(no_forward, PROMPT, by_position(0, acceptance=acceptance), drafter=drafter)


@pytest.mark.parametrize("acceptance", ["token", "block"])
def test_drafts_with_q_under_token_or_block_are_refused_before_their_verification(model, acceptance, monkeypatch):
    """A drafter that does not say it samples: its first draft with q is refused before the forward verifies it."""
    gen = Generation(
        model, PROMPT, by_position(0, acceptance=acceptance), drafter=SampledDrafter(), policy=DraftPolicy.fixed(3)
    )
    verified = []
    monkeypatch.setattr(gen.target.inner, "verify", lambda *a, **k: verified.append(a))
    with pytest.raises(ValueError, match=rf"acceptance '{acceptance}' cannot .* drafter sampled's drafts sampled"):
        list(gen)
    assert not verified


def test_first_divergence_counts_a_prefix_as_differing_at_its_end():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="run on a CUDA device (pytest -m gpu)")
@pytest.mark.parametrize("acceptance", ["token", "exact-match", "block"])
def test_on_the_gpu_speculative_sampling_gives_plain_sampling_tokens(acceptance):
    """Paths and trees (exact verification, the default when sampling by position) and batches (fast verification
    of the [B, w] block) on the GPU, through the public calls, with one seed each run."""
    from specbench.decoding import generate as plain_generate
    from specbench.decoding import speculative_generate

    gpu_model = build_tiny("llama", seed=3, scale=1.5)
    check = same_tokens_check(
        gpu_model, PROMPT, "lookup", "fixed:4", runs=RUNS, max_tokens=32, rule=acceptance, progress=False
    )
    assert check.same == RUNS and check.accepted_drafts > 0, check.describe()
    prompts = [PROMPT, [3, 8, 3, 8, 3, 8, 3]]
    options = [by_position(20 + i, max_tokens=16, acceptance=acceptance) for i in range(len(prompts))]
    truth = [list(plain_generate(gpu_model, p, o)) for p, o in zip(prompts, options)]
    if acceptance != "block":  # block verifies paths only
        tree = TruthTree(truth[0], len(PROMPT))
        gen = speculative_generate(
            gpu_model, PROMPT, options[0], drafter=tree, policy=DraftPolicy.fixed(8), progress=None
        )
        assert list(gen) == truth[0]
    drafters = [
        ScriptedDrafter(t, len(p), 97, wrong_at=lambda step, i: (step + i) % 3 == 2) for p, t in zip(prompts, truth)
    ]
    batch = BatchGeneration(gpu_model, prompts, options, drafters, DraftPolicy.fixed(4))
    assert batch.run() == truth  # equal wherever the block's logits draw as plain decoding's do
