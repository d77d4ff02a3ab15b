"""Acceptance rules at T > 0: block verification's exact distribution and its advantage over the token-wise
rule, each rule's greedy limit, batches and drafters with and without q, and bad input."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest
from conftest import build_tiny, plain_greedy
from hypothesis import given, settings
from hypothesis import strategies as st

from scripts.gpu.draft_training import draft_from_target
from specbench import Draft, Drafter, DraftPolicy, GenerateOptions, Generation, generate, speculative_generate
from specbench.core.rules import ExactMatch, Typical, block_residual, block_weights, rule_for, rule_names
from specbench.core.verify import accept_greedy, accept_tree_greedy
from specbench.decoding import speculative_generate_batch
from specbench.drafters import DraftModel, PromptLookup, SuffixDecoding

PROMPT = [5, 17, 3, 9, 5, 17, 3, 9]


class Tables:
    """A random target p(. | prefix) and drafter q(. | prefix) over a small vocabulary, for every prefix."""

    def __init__(self, seed: int, vocab: int, k: int, concentration: float, deterministic: bool):
        rng = np.random.default_rng(seed)
        self.vocab, self.k, self.deterministic = vocab, k, deterministic
        self.p = {x: rng.dirichlet([concentration] * vocab) for n in range(k + 2) for x in self.prefixes(n)}
        self.q = {}
        for n in range(k):
            for x in self.prefixes(n):
                self.q[x] = np.eye(vocab)[rng.integers(vocab)] if deterministic else rng.dirichlet([1.0] * vocab)

    def prefixes(self, n: int):
        return itertools.product(range(self.vocab), repeat=n)

    def drafts(self):
        """Every draft of k tokens with its probability under q."""
        for x in self.prefixes(self.k):
            weight = float(np.prod([self.q[x[:i]][x[i]] for i in range(self.k)]))
            if weight > 0:
                yield x, weight

    def rows(self, x):
        p = np.stack([self.p[x[:i]] for i in range(self.k + 1)])
        return p, np.stack([self.q[x[:i]] for i in range(self.k)])


def block_outcomes(tables: Tables, x) -> tuple[np.ndarray, list[np.ndarray]]:
    """P(tau = i | draft x) for i = 0..k, and the next token's distribution after each tau."""
    p, q = tables.rows(x)
    w, h, _ = block_weights(p, q, list(x))
    k = tables.k
    tau = np.array([h[i] * np.prod(1 - h[i + 1 :]) if i else np.prod(1 - h[1:]) for i in range(k + 1)])
    nxt = [block_residual(p[i], q[i], w[i]) if i < k else p[k] for i in range(k + 1)]
    return tau, nxt


def output_distribution(tables: Tables) -> np.ndarray:
    """The exact distribution of the first k + 1 tokens: one block step, then plain sampling."""
    k, vocab = tables.k, tables.vocab
    out = np.zeros((vocab,) * (k + 1))
    for x, weight in tables.drafts():
        tau, nxt = block_outcomes(tables, x)
        for i in range(k + 1):
            for y in range(vocab):
                head = x[:i] + (y,)
                mass = weight * tau[i] * nxt[i][y]
                for tail in tables.prefixes(k - i):
                    seq = head + tail
                    rest = np.prod([tables.p[seq[:j]][seq[j]] for j in range(i + 1, k + 1)])
                    out[seq] += mass * rest
    return out


def target_distribution(tables: Tables) -> np.ndarray:
    out = np.zeros((tables.vocab,) * (tables.k + 1))
    for seq in tables.prefixes(tables.k + 1):
        out[seq] = np.prod([tables.p[seq[:j]][seq[j]] for j in range(tables.k + 1)])
    return out


tables_strategy = st.builds(
    Tables,
    seed=st.integers(0, 2**31),
    vocab=st.integers(2, 4),
    k=st.integers(1, 3),
    concentration=st.sampled_from([0.2, 1.0, 5.0]),
    deterministic=st.booleans(),
)


@settings(max_examples=40, deadline=None)
@given(tables_strategy)
def test_block_step_is_exactly_lossless(tables):
    """One block step followed by plain sampling gives the target's joint distribution, exactly."""
    np.testing.assert_allclose(output_distribution(tables), target_distribution(tables), atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(tables_strategy)
def test_block_accepts_at_least_as_many_as_token_wise_on_every_step(tables):
    """On every draft's p and q, the chance that block verification accepts the first i tokens (given them,
    over the draft tokens after them) is its prefix weight w_i, never below the token-wise rule's
    prod_j min(1, p_j / q_j); so is its expected count of accepted tokens, over drafts and per draft prefix."""
    k = tables.k
    expected_block = expected_token = 0.0
    reach = {}  # prefix -> (q-probability of it, P(tau >= len(prefix)) summed over its extensions)
    for x, weight in tables.drafts():
        p, q = tables.rows(x)
        w, _, _ = block_weights(p, q, list(x))
        ratios = np.minimum(1.0, p[np.arange(k), list(x)] / q[np.arange(k), list(x)])
        token = np.cumprod(ratios)
        assert np.all(w[1:] >= token - 1e-12)
        tau, _ = block_outcomes(tables, x)
        at_least = tau[::-1].cumsum()[::-1]  # P(tau >= i | x)
        expected_block += weight * at_least[1:].sum()
        expected_token += weight * token.sum()
        for i in range(1, k + 1):
            mass, hit = reach.get(x[:i], (0.0, 0.0))
            reach[x[:i]] = (mass + weight, hit + weight * at_least[i])
    assert expected_block >= expected_token - 1e-12
    for prefix, (mass, hit) in reach.items():  # the lemma behind it: P(tau >= i | x_1..x_i) = w_i
        if mass > 1e-12:
            p, q = tables.rows(prefix + (0,) * (k - len(prefix)))
            w, _, _ = block_weights(p, q, list(prefix) + [0] * (k - len(prefix)))
            assert hit / mass == pytest.approx(w[len(prefix)], abs=1e-9)


def test_block_accepts_more_than_token_wise_where_the_paper_says():
    """A draft whose first token q over-proposes and whose second p favours: token-wise accepts one token
    at most with 0.5, block verification accepts both more often (the paper's motivating kind of case)."""
    p = np.array([[0.5, 0.5], [0.1, 0.9], [0.5, 0.5]])
    q = np.array([[1.0, 0.0], [0.9, 0.1]])
    w, _, _ = block_weights(p, q, [0, 1])
    token = np.cumprod([0.5, 1.0])
    assert w[2] == pytest.approx(1.0) and w[2] > token[1]


class FixedGuess(Drafter):
    """Drafts tokens computed from the context's length: deterministic, mostly rejected."""

    name = "fixed-guess"

    def draft(self, context, k):
        return Draft([(len(context) * 7 + i) % 97 for i in range(k)])


class GreedyOracle(Drafter):
    """Drafts the known greedy continuation with every third drafted token changed: accepted and rejected."""

    name = "greedy-oracle"

    def __init__(self, prompt: list[int], greedy: list[int]):
        self.sequence = list(prompt) + list(greedy)

    def draft(self, context, k):
        ahead = self.sequence[len(context) : len(context) + k]
        return Draft([(t + 1) % 97 if (len(context) + i) % 3 == 2 else t for i, t in enumerate(ahead)])


@pytest.fixture(scope="module")
def model():
    return build_tiny("llama", seed=1)


@pytest.mark.parametrize("rule", rule_names())
def test_each_rule_is_greedy_at_temperature_zero_and_near_it(model, rule):
    """At T = 0 every rule is the greedy rule; as T -> 0 each rule's output tends to greedy decoding's."""
    greedy = plain_greedy(model, PROMPT, 24)
    for temperature in (0.0, 1e-6):
        options = GenerateOptions(max_tokens=24, temperature=temperature, seed=3, acceptance_rule=rule, verify="fast")
        assert list(generate(model, PROMPT, options)) == greedy
        for drafter in (PromptLookup(), GreedyOracle(PROMPT, greedy)):
            gen = speculative_generate(model, PROMPT, options, drafter=drafter, policy=DraftPolicy.fixed(3))
            assert list(gen) == greedy, (rule, temperature, drafter.name)
        stats = gen.stats()
        assert 0 < stats["accepted"] < stats["drafted"]


@pytest.fixture(scope="module")
def draft_pair():
    target = build_tiny("llama", seed=2, num_hidden_layers=3, scale=1.5)
    return target, draft_from_target(target, [0, 2])


@pytest.mark.parametrize("rule", rule_names())
def test_each_rule_runs_with_drafters_with_and_without_q(draft_pair, rule):
    target, small = draft_pair
    options = GenerateOptions(max_tokens=16, temperature=1.0, seed=5, acceptance_rule=rule, ignore_eos=True)
    for drafter in (PromptLookup(), SuffixDecoding(), DraftModel(small, target=target, sampling=options)):
        gen = Generation(target, PROMPT, options, drafter=drafter, policy=DraftPolicy.fixed(3))
        tokens = list(gen)
        assert len(tokens) == 16 and all(0 <= t < 97 for t in tokens)
        verifies = [r for r in gen.log if r.kind == "verify"]
        assert all(len(r.accept_probs) == r.k_drafted for r in verifies)
        assert all(0 <= x <= 1 for r in verifies for x in r.accept_probs)
    assert gen.stats()["drafted"] > 0


@pytest.mark.parametrize("rule", rule_names())
def test_each_rule_in_a_batch(draft_pair, rule):
    """Batches sample by the request's rule: seeded rows repeat, greedy rows equal single-request greedy."""
    target, _ = draft_pair
    prompts = [PROMPT, PROMPT[2:], [4, 4, 8, 4, 4, 8]]

    def run(temperature):
        options = [
            GenerateOptions(max_tokens=12, temperature=temperature, seed=i, acceptance_rule=rule, ignore_eos=True)
            for i in range(len(prompts))
        ]
        drafters = [PromptLookup(), FixedGuess(), SuffixDecoding()]
        gen = speculative_generate_batch(
            target, prompts, options, drafters=drafters, policy=DraftPolicy.fixed(3), progress=None
        )
        return gen.run()

    sampled = run(1.0)
    assert sampled == run(1.0)
    assert all(len(tokens) == 12 for tokens in sampled)
    greedy = run(0.0)
    assert greedy == [plain_greedy(target, p, 12) for p in prompts]


def test_typical_on_a_tree_follows_the_longest_passing_path():
    p = mx.array([[0.6, 0.3, 0.1], [0.05, 0.05, 0.9], [0.5, 0.5, 0.0], [0.2, 0.2, 0.6]])
    mx.random.seed(0)
    # root children: node 0 (token 0, passes), node 1 (token 1, passes); node 2 (token 2) under node 0 passes
    path, emitted, passed = Typical(0.09, 0.3).tree(p, [0, 1, 2], [-1, -1, 0], None)
    assert path == [0, 2] and emitted[:2] == [0, 2] and passed == [1.0, 1.0, 1.0]
    path, emitted, _ = ExactMatch().tree(mx.array(np.eye(3)[[1, 2, 0, 1]]), [0, 1, 2], [-1, -1, 0], None)
    assert path == [1] and emitted == [1, 0]


# -- bad input: one clear error before any model work -------------------------------------------


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            dict(acceptance_rule="greedy"),
            r"acceptance_rule must be one of token, exact-match, block, typical.*got 'greedy'",
        ),
        (dict(acceptance_rule=None), r"acceptance_rule must be one of .*got None"),
        (dict(acceptance_rule=3), r"acceptance_rule must be one of .*or an AcceptanceRule, got 3"),
    ],
)
def test_bad_acceptance_is_one_clear_error(no_forward, fields, message):
    with pytest.raises(ValueError, match=message):
        list(
            speculative_generate(no_forward, PROMPT, GenerateOptions(temperature=1.0, **fields), drafter=PromptLookup())
        )


@pytest.mark.parametrize(
    "parameters, message",
    [
        (dict(epsilon=0.0), r"typical epsilon must be in \(0, 1\].*got 0\.0"),
        (dict(delta=1.5), r"typical delta must be in \(0, 1\].*got 1\.5"),
        (dict(epsilon=float("nan")), r"typical epsilon must be in \(0, 1\].*got nan"),
        (dict(alpha=0.5), r"acceptance rule 'typical' takes epsilon, delta, got alpha"),
    ],
)
def test_a_rule_checks_its_own_parameters(parameters, message):
    """A rule carries its parameters and checks them where it is made, before any options or model."""
    with pytest.raises(ValueError, match=message):
        rule_for("typical", **parameters)


def test_block_with_a_tree_drafter_is_an_error_before_model_work(no_forward):
    options = GenerateOptions(temperature=0.7, acceptance_rule="block")
    with pytest.raises(ValueError, match="acceptance_rule 'block' verifies path drafts only"):
        speculative_generate(
            no_forward, PROMPT, options, drafter=SuffixDecoding(tree=True), policy=DraftPolicy.fixed(4)
        )
    with pytest.raises(TypeError, match="typical delta"):
        GenerateOptions(acceptance_rule=Typical(delta="0.3")).check()


def _rows(n: int, vocab: int = 5) -> mx.array:
    return mx.full((n, vocab), 1.0 / vocab)


TABLE_CASES = {
    "p a row short": (3, None, r"p have shape \(3, 5\), but a draft of 3 tokens needs \(4, vocab\)"),
    "p a row long": (5, None, r"p have shape \(5, 5\), but a draft of 3 tokens needs \(4, vocab\)"),
    "q a row short": (4, 2, r"q have shape \(2, 5\), but a draft of 3 tokens needs \(3, 5\)"),
}
#: (rule, case): every rule with a p that does not fit; the rules that read q (token, block) with a q that does not.
TABLE_FITS = [(r, c) for r in rule_names() for c in TABLE_CASES if r in ("token", "block") or c[0] == "p"]


@pytest.mark.parametrize("rule, case", TABLE_FITS, ids=[f"{r}-{c}" for r, c in TABLE_FITS])
def test_each_rule_refuses_probability_tables_that_do_not_fit_the_draft(rule, case):
    """A table a row short would be read past its end: one clear error instead, for paths and trees."""
    p_rows, q_rows, message = TABLE_CASES[case]
    chosen = rule_for(rule)
    draft, q = [1, 2, 3], _rows(q_rows) if q_rows else None
    with pytest.raises(ValueError, match=rf"acceptance rule '{rule}': .*{message}"):
        chosen.path(_rows(p_rows), draft, q)
    if not chosen.paths_only:
        with pytest.raises(ValueError, match=message):
            chosen.tree(_rows(p_rows), draft, [-1, 0, 0], q)


def test_block_weights_refuse_a_target_table_a_row_short():
    p, q = np.full((2, 4), 0.25), np.full((2, 4), 0.25)
    with pytest.raises(ValueError, match=r"acceptance rule 'block': .*shape \(2, 4\).*needs \(3, vocab\)"):
        block_weights(p, q, [1, 2])
    assert block_weights(np.full((3, 4), 0.25), q, [1, 2])[0].tolist() == [1.0, 1.0, 1.0]


def test_the_greedy_rule_refuses_targets_that_do_not_fit_the_draft():
    assert accept_greedy([1, 2], [1, 2, 3]) == (2, [1, 2, 3])
    with pytest.raises(ValueError, match=r"one target per drafted token and the bonus one: 3 for a draft of 2, got 2"):
        accept_greedy([1, 2], [1, 2])
    assert accept_tree_greedy([1, 2], [-1, 0], [1, 2, 4]) == ([0, 1], [1, 2, 4])
    with pytest.raises(ValueError, match=r"one target per tree row: 3 for a tree of 2 nodes and its root, got 2"):
        accept_tree_greedy([1, 2], [-1, 0], [1, 2])
