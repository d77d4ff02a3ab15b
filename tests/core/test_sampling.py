"""Losslessness: speculative sampling draws tokens exactly as plain sampling does."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest
from conftest import build_tiny
from scipy.stats import chisquare

from specbench import Draft, Drafter, DraftPolicy, GenerateOptions, generate, speculative_generate
from specbench.core import rules
from specbench.core.accept import accept_sampled

VOCAB = 5
PROMPT = [1, 2, 3, 4]
TOKENS = 3
RUNS = 1000


def reference_probs(logits: np.ndarray, temperature: float, top_p: float = 1.0, top_k: int = 0) -> np.ndarray:
    """Plain sampling's distribution, computed independently in numpy."""
    logits = logits.astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    keep = np.ones_like(p, dtype=bool)
    if top_k:
        keep &= p >= np.sort(p)[-top_k]
    if top_p < 1.0:
        order = np.argsort(-p)
        mass_before = np.cumsum(p[order]) - p[order]
        keep_sorted = mass_before < top_p
        nucleus = np.zeros_like(keep)
        nucleus[order[keep_sorted]] = True
        keep &= nucleus
    scaled = np.where(keep, np.log(np.maximum(p, 1e-300)) / temperature, -np.inf)
    out = np.exp(scaled - scaled.max())
    return out / out.sum()


def exact_sequence_distribution(model, settings) -> dict[tuple[int, ...], float]:
    """P(first TOKENS tokens) under plain sampling, by enumerating every prefix."""
    dist = {}
    for seq in itertools.product(range(VOCAB), repeat=TOKENS):
        prob = 1.0
        for i in range(TOKENS):
            logits = model(mx.array([PROMPT + list(seq[:i])]))[0, -1]
            prob *= reference_probs(np.array(logits), *settings)[seq[i]]
            if prob == 0:
                break
        dist[seq] = prob
    return dist


class GuessingDrafter(Drafter):
    """Proposes tokens from a fixed distribution q (non-deterministic) or a fixed guess."""

    name = "guess"

    def __init__(self, with_probs: bool):
        self.with_probs = with_probs
        self.q = mx.array([0.1, 0.4, 0.2, 0.2, 0.1])

    def draft(self, context, k):
        if not self.with_probs:
            return Draft([(len(context) * 3) % VOCAB for _ in range(k)])
        tokens = mx.random.categorical(mx.log(self.q), shape=(k,)).tolist()
        return Draft(tokens, mx.broadcast_to(self.q, (k, VOCAB)))


def sample_counts(model, settings, drafter=None, acceptance="token") -> dict[tuple[int, ...], int]:
    temperature, top_p, top_k = settings
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(RUNS):
        opts = GenerateOptions(
            max_tokens=TOKENS, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, acceptance_rule=acceptance
        )
        if drafter is None:
            gen = generate(model, PROMPT, opts)
        else:
            gen = speculative_generate(model, PROMPT, opts, drafter=drafter, policy=DraftPolicy.fixed(2))
        seq = tuple(gen)
        counts[seq] = counts.get(seq, 0) + 1
    return counts


def goodness_of_fit(counts, dist) -> float:
    expected = np.array([dist[s] * RUNS for s in dist])
    observed = np.array([counts.get(s, 0) for s in dist])
    assert sum(counts.values()) == RUNS and set(counts) <= {s for s, p in dist.items() if p > 0}
    # Pool rare outcomes so every bin expects at least 5 draws.
    order = np.argsort(expected)
    pooled_e, pooled_o, acc_e, acc_o = [], [], 0.0, 0
    for i in order:
        acc_e += expected[i]
        acc_o += observed[i]
        if acc_e >= 5:
            pooled_e.append(acc_e), pooled_o.append(acc_o)
            acc_e, acc_o = 0.0, 0
    pooled_e[-1] += acc_e
    pooled_o[-1] += acc_o
    return chisquare(pooled_o, pooled_e).pvalue


@pytest.fixture(scope="module")
def small_vocab_model():
    return build_tiny("llama", seed=3, scale=1.5, vocab_size=VOCAB)


@pytest.mark.parametrize(
    "settings, with_probs",
    [((1.0, 1.0, 0), False), ((0.7, 1.0, 0), True), ((1.0, 0.8, 0), False), ((1.0, 1.0, 3), True)],
    ids=["temp1-deterministic", "temp0.7-q", "top_p0.8", "top_k3-q"],
)
def test_speculative_sampling_is_lossless(small_vocab_model, settings, with_probs):
    dist = exact_sequence_distribution(small_vocab_model, settings)
    spec = sample_counts(small_vocab_model, settings, GuessingDrafter(with_probs))
    assert goodness_of_fit(spec, dist) > 1e-3


@pytest.mark.parametrize(
    "acceptance, settings, with_probs",
    [("block", (1.0, 1.0, 0), True), ("block", (0.7, 1.0, 0), False), ("exact-match", (1.0, 1.0, 0), False)],
    ids=["block-q", "block-deterministic-temp0.7", "exact-match"],
)
def test_each_lossless_rule_passes_the_chi_square_test(small_vocab_model, acceptance, settings, with_probs):
    dist = exact_sequence_distribution(small_vocab_model, settings)
    spec = sample_counts(small_vocab_model, settings, GuessingDrafter(with_probs), acceptance)
    assert goodness_of_fit(spec, dist) > 1e-3


def test_a_deliberately_broken_block_rule_fails_the_chi_square_test(small_vocab_model, monkeypatch):
    """Block verification that samples the token after a partly accepted draft from p, not from its residual."""
    monkeypatch.setattr(rules, "block_residual", lambda p_row, q_row, weight: p_row / p_row.sum())
    settings = (1.0, 1.0, 0)
    dist = exact_sequence_distribution(small_vocab_model, settings)
    spec = sample_counts(small_vocab_model, settings, GuessingDrafter(False), "block")
    assert goodness_of_fit(spec, dist) < 1e-6


def test_plain_sampling_matches_reference(small_vocab_model):
    settings = (1.0, 0.8, 0)
    dist = exact_sequence_distribution(small_vocab_model, settings)
    assert goodness_of_fit(sample_counts(small_vocab_model, settings), dist) > 1e-3


def test_seed_repeats_bit_for_bit(small_vocab_model):
    opts = GenerateOptions(max_tokens=20, temperature=1.0, seed=11)
    a = list(
        speculative_generate(
            small_vocab_model, PROMPT, opts, drafter=GuessingDrafter(True), policy=DraftPolicy.fixed(3)
        )
    )
    b = list(
        speculative_generate(
            small_vocab_model, PROMPT, opts, drafter=GuessingDrafter(True), policy=DraftPolicy.fixed(3)
        )
    )
    assert a == b


def test_accept_rule_residual_distribution():
    """One step of the rule with q != p: the emitted first token is distributed as p."""
    p = mx.array([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = mx.array([[0.1, 0.1, 0.4, 0.4]])
    draws = 4000
    counts = np.zeros(4)
    mx.random.seed(0)
    for _ in range(draws):
        token = int(mx.random.categorical(mx.log(q[0])).item())
        _, emitted, probs = accept_sampled(p, [token], q)
        counts[emitted[0]] += 1
    assert counts[3] == 0
    assert chisquare(counts[:3], np.array([0.5, 0.3, 0.2]) * draws).pvalue > 1e-3
