"""Token trees: tree-verified greedy equals plain greedy; the cache keeps the accepted path; tree
sampling is lossless."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np
import pytest
from conftest import build_tiny
from mlx_lm.models.cache import make_prompt_cache
from scipy.stats import chisquare

from specbench.core.accept import accept_tree_sampled
from specbench.core.draft import Draft, Drafter
from specbench.core.engine import Generation, plain_generation
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.core.target import ModelTarget
from specbench.core.tree import breadth_first_tree, children, tree_mask
from specbench.core.verify import as_draft, check_draft

PROMPT = [5, 9, 13, 2, 7]
BRANCHES, DEPTH = 3, 3


class BranchingDrafter(Drafter):
    """Three chains of three nodes under the root, plus a wrong sibling under each chain's first node.

    Step s puts the true continuation on branch s % 3 down to depth (s // 3) % 4 and wrong tokens
    everywhere else, so the accepted path ends at every depth of every branch (depth 0: the root only).
    """

    name = "branching"

    def __init__(self, truth: list[int], vocab: int):
        self.truth, self.vocab, self.calls = truth, vocab, 0

    def draft(self, context, k):
        done = len(context) - len(PROMPT)
        true = (self.truth[done : done + DEPTH] + [1] * DEPTH)[:DEPTH]
        branch, depth = self.calls % BRANCHES, (self.calls // BRANCHES) % (DEPTH + 1)
        self.calls += 1
        tokens, parents = [], []
        for b in range(BRANCHES):
            parent = -1
            for d in range(DEPTH):
                good = b == branch and d < depth
                # Wrong tokens differ from the truth and from each other under one parent.
                tokens.append(true[d] if good else (true[d] + 1 + b + (d == 0 and b > branch)) % self.vocab)
                parents.append(parent)
                parent = len(tokens) - 1
            tokens.append((true[1] + 7 + b) % self.vocab)  # a wrong sibling at depth 2
            parents.append(len(tokens) - DEPTH)
        return Draft(tokens, parents=parents)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe"])
def test_tree_greedy_equals_plain_greedy(arch):
    model = build_tiny(arch)
    options = GenerateOptions(max_tokens=40)
    truth = list(plain_generation(model, PROMPT, options))
    drafter = BranchingDrafter(truth, 97)
    gen = Generation(model, PROMPT, options, drafter=drafter, policy=DraftPolicy.fixed(BRANCHES * (DEPTH + 1)))
    assert list(gen) == truth
    verifies = [r for r in gen.log if r.kind == "verify"]
    assert verifies[0].tree_nodes == BRANCHES * (DEPTH + 1) and verifies[0].tree_depth == DEPTH
    # Near the end the policy asks for fewer nodes: a tree cut to a path is verified as a path.
    assert all(r.tree_nodes == r.k_drafted == len(r.draft_parents) for r in verifies if r.tree_nodes)
    ends = set()
    for r in (r for r in verifies if r.tree_nodes):
        path = r.accepted_path
        assert r.accepted == len(path) and r.accepted_positions == list(range(len(path)))
        ends.add((path[0] // (DEPTH + 1) if path else None, len(path)))
    every = {(None, 0)} | {(b, d) for b in range(BRANCHES) for d in range(1, DEPTH + 1)}
    assert every <= ends


def test_exact_tree_verification_equals_plain_greedy():
    from specbench.exact import ExactVerifier

    model = build_tiny("qwen3_moe")
    options = GenerateOptions(max_tokens=24)
    truth = list(plain_generation(model, PROMPT, options))
    gen = Generation(
        model,
        PROMPT,
        options,
        drafter=BranchingDrafter(truth, 97),
        policy=DraftPolicy.fixed(BRANCHES * (DEPTH + 1)),
        verifier=ExactVerifier(model, level="attention"),
    )
    assert list(gen) == truth
    assert any(r.accepted_path and r.accepted_path[0] > 0 for r in gen.log if r.kind == "verify")


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_compaction_leaves_the_serial_cache(arch):
    """After a tree verification the cache holds exactly what serial decoding of the accepted tokens
    gives, and the hidden rows are those of the accepted path (the tree's forward in exact mode with every op
    split, so each row is computed as a serial step computes it, on any device)."""
    from specbench.exact import ExactVerifier

    model = build_tiny(arch)
    truth = list(plain_generation(model, PROMPT, GenerateOptions(max_tokens=5)))

    def wrong(t):
        return (t + 1) % 97

    # Branch 0 wrong; branch 1 right for three tokens, with a wrong sibling at depth 2.
    tokens = [wrong(truth[1]), wrong(truth[2]), truth[1], wrong(truth[2]), truth[2], truth[3]]
    parents = [-1, 0, -1, 2, 2, 4]
    target = ModelTarget(
        model, GenerateOptions(max_tokens=20), ExactVerifier(model, "all"), needs_hidden=True, speculative=True
    )
    with target.running():
        target.prefill(PROMPT, 0)
        step = target.verify(tokens, None, 1, parents=parents)
    assert step.path == [2, 4, 5] and step.tokens == truth[1:5]
    serial = make_prompt_cache(model)
    model.model(mx.array([PROMPT]), cache=serial)  # the prompt in one forward, as decoding prefills it
    rows = [model.model(mx.array([[t]]), cache=serial) for t in truth[:4]]
    for tree_cache, serial_cache in zip(target.cache, serial):
        assert tree_cache.offset == serial_cache.offset == len(PROMPT) + 4
        for a, b in zip(tree_cache.state[:2], serial_cache.state[:2]):
            assert mx.array_equal(a[..., : tree_cache.offset, :], b[..., : serial_cache.offset, :])
    assert mx.array_equal(step.hidden, mx.concatenate(rows, axis=1))


def test_tree_helpers_and_bad_trees():
    assert tree_mask([-1, 0, -1]).tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, False, False, True],
    ]
    assert breadth_first_tree([[1, 2, 3], [1, 2, 4], [5, 6]], budget=5) == ([1, 5, 2, 6, 3], [-1, -1, 0, 1, 2])
    assert children([-1, 0, -1]) == {-1: [0, 2], 0: [1], 1: [], 2: []}
    # A path given as a tree is a path; truncation keeps the first k nodes with their parents.
    assert check_draft(Draft([1, 2], parents=[-1, 0]), "d", 97, False).parents is None
    assert as_draft(Draft([1, 2, 3], parents=[-1, -1, 0]), 2).parents == [-1, -1]
    with pytest.raises(ValueError, match="earlier node"):
        check_draft(Draft([1, 2], parents=[1, -1]), "d", 97, False)
    with pytest.raises(ValueError, match="one parent index per node"):
        check_draft(Draft([1, 2], parents=[-1]), "d", 97, False)
    with pytest.raises(ValueError, match="siblings must differ"):
        check_draft(Draft([4, 4], parents=[-1, -1]), "d", 97, False)


def test_hybrid_model_is_a_clear_error():
    from mlx_lm.models.cache import ArraysCache

    model = build_tiny("llama")
    target = ModelTarget(model, GenerateOptions(max_tokens=4), speculative=True)
    target.cache[0] = ArraysCache(2)
    from specbench.core.tree import tree_attention

    with pytest.raises(ValueError, match="ArraysCache"):
        with tree_attention(model, target.cache, [-1, -1]):
            pass


# -- lossless sampling ----------------------------------------------------------------------------

VOCAB = 4
#: A two-token "model": P(first) and P(second | first).
FIRST = np.array([0.4, 0.3, 0.2, 0.1])
SECOND = np.array([[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25], [0.0, 0.5, 0.5, 0.0]])
Q = np.array([0.1, 0.5, 0.3, 0.1])


def _sabotaged(p, tokens, parents, q):
    """Recursive rejection without the residual: a rejected sibling keeps its mass."""
    rng = np.random.default_rng(int(mx.random.randint(0, 2**31, shape=()).item()))
    kids = children(parents)
    path, node = [], -1
    while True:
        row = np.array(p[node + 1], dtype=np.float64)
        for child in kids[node]:
            x = tokens[child]
            qx = 1.0 if q is None else float(q[child][x].item())
            if rng.random() < min(1.0, row[x] / qx):
                path.append(child)
                node = child
                break
        else:
            return path, [tokens[i] for i in path] + [int(rng.choice(len(row), p=row / row.sum()))], []


def two_token_pvalue(rule, with_q: bool, draws: int = 1500) -> float:
    """Decode two tokens of the table model with a tree draft per step; chi-square of the pairs."""
    mx.random.seed(1)
    rng = np.random.default_rng(1)
    counts = np.zeros((VOCAB, VOCAB))
    for _ in range(draws):
        out: list[int] = []
        while len(out) < 2:
            # Two siblings drawn from Q without replacement (or fixed), each with one deterministic child.
            firsts, sibling_q = [0, 1], [Q, Q]
            if with_q:
                first = int(rng.choice(VOCAB, p=Q))
                rest = np.where(np.arange(VOCAB) == first, 0.0, Q) / (1 - Q[first])
                firsts, sibling_q = [first, int(rng.choice(VOCAB, p=rest))], [Q, rest]
            tokens, parents, q_rows = [], [], []
            for f, q_f in zip(firsts, sibling_q):
                tokens += [f, (f + 1) % VOCAB]
                parents += [-1, len(tokens) - 2]
                q_rows += [q_f, np.eye(VOCAB)[(f + 1) % VOCAB]]
            rows = [FIRST if not out else SECOND[out[0]]]
            for i, t in enumerate(tokens):
                rows.append(SECOND[t] if parents[i] == -1 and not out else np.full(VOCAB, 1 / VOCAB))
            q = mx.array(np.stack(q_rows))
            _, emitted, _ = rule(mx.array(np.stack(rows)), tokens, parents, q if with_q else None)
            out += emitted
        counts[out[0], out[1]] += 1
    expected = (FIRST[:, None] * SECOND).ravel() * draws
    observed = counts.ravel()
    keep = expected > 0
    assert observed[~keep].sum() == 0
    return chisquare(observed[keep], expected[keep]).pvalue


@pytest.mark.parametrize("with_q", [False, True], ids=["deterministic", "q"])
def test_tree_sampling_is_lossless_and_a_sabotaged_rule_is_caught(with_q):
    assert two_token_pvalue(accept_tree_sampled, with_q) > 1e-3
    assert two_token_pvalue(_sabotaged, with_q) < 1e-6


class SampledTreeDrafter(Drafter):
    """Two root children drawn from a fixed q without replacement, each with a deterministic child."""

    name = "sampled-tree"

    def __init__(self):
        self.q = mx.array([0.1, 0.4, 0.2, 0.2, 0.1])

    def draft(self, context, k):
        first = int(mx.random.categorical(mx.log(self.q)).item())
        rest = mx.where(mx.arange(5) == first, 0.0, self.q) / (1 - self.q[first])
        second = int(mx.random.categorical(mx.log(rest)).item())
        tokens, parents, rows = [], [], []
        for f, q_f in ((first, self.q), (second, rest)):
            tokens += [f, (f + len(context)) % 5]
            parents += [-1, len(tokens) - 2]
            rows += [q_f, mx.eye(5)[tokens[-1]]]
        return Draft(tokens, mx.stack(rows), parents)


def test_tree_sampling_end_to_end_matches_plain_sampling():
    """Tree-speculative sampling of a tiny model: the distribution of the first three tokens is plain
    sampling's (six are generated, so that the policy asks for whole trees)."""
    model = build_tiny("llama", seed=3, scale=1.5, vocab_size=5)
    prompt, n, runs = [1, 2, 3, 4], 3, 300
    dist = {}
    for seq in itertools.product(range(5), repeat=n):
        prob = 1.0
        for i in range(n):
            logits = np.array(model(mx.array([prompt + list(seq[:i])]))[0, -1], dtype=np.float64)
            p = np.exp(logits - logits.max())
            prob *= (p / p.sum())[seq[i]]
        dist[seq] = prob
    counts: dict[tuple[int, ...], int] = {}
    accepted = 0
    for seed in range(runs):
        options = GenerateOptions(max_tokens=2 * n, temperature=1.0, seed=seed)
        gen = Generation(model, prompt, options, drafter=SampledTreeDrafter(), policy=DraftPolicy.fixed(4))
        seq = tuple(gen)[:n]
        accepted += gen.stats()["accepted"]
        counts[seq] = counts.get(seq, 0) + 1
    assert accepted > 50
    expected = np.array([dist[s] * runs for s in dist])
    observed = np.array([counts.get(s, 0) for s in dist])
    order = np.argsort(expected)
    pooled_e, pooled_o, acc_e, acc_o = [], [], 0.0, 0
    for i in order:
        acc_e, acc_o = acc_e + expected[i], acc_o + observed[i]
        if acc_e >= 5:
            pooled_e.append(acc_e), pooled_o.append(acc_o)
            acc_e, acc_o = 0.0, 0
    pooled_e[-1] += acc_e
    pooled_o[-1] += acc_o
    assert chisquare(pooled_o, pooled_e).pvalue > 1e-3


def _path_to(node: int, parents: list[int]) -> list[int]:
    """Nodes from the root's child down to ``node`` (empty for the root, -1)."""
    out = []
    while node >= 0:
        out.append(node)
        node = parents[node]
    return out[::-1]


@pytest.mark.parametrize("arch, level", [("qwen3", "auto"), ("qwen3_moe", "all"), ("llama", "serial")])
def test_exact_tree_rows_equal_serial_decoding_along_each_path(arch, level, fresh_calibrations):
    """Exact mode: every node's logits row is bit for bit what serial decoding along its path computes, with the
    level this device's calibration picks for the tree's width ("auto"), every op split, or serial steps."""
    from specbench.core.tree import tree_attention
    from specbench.core.verify import forward
    from specbench.exact import ExactVerifier

    model = build_tiny(arch)
    tokens, parents = [11, 12, 13, 14, 15, 16, 17], [-1, 0, 0, -1, 3, 4, 1]
    verifier = ExactVerifier(model, level=level)
    cache = make_prompt_cache(model)
    mx.eval(forward(model, mx.array([PROMPT]), cache))
    with tree_attention(model, cache, parents):
        logits = verifier.forward(model, mx.array([[3] + tokens]), cache)[0]
    for node in range(-1, len(tokens)):
        serial = make_prompt_cache(model)
        mx.eval(forward(model, mx.array([PROMPT]), serial))
        for t in [3] + [tokens[i] for i in _path_to(node, parents)]:
            row = forward(model, mx.array([[t]]), serial)[0, -1]
        assert mx.array_equal(logits[node + 1], row), node
