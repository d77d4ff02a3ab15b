"""The top-k-match acceptance rule: lossy by design, registered by its module alone."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from conftest import build_tiny

from specbench.core.engine import Generation
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.core.rules import rule_for, rule_names
from specbench.core.rules.top_k_match import TopKMatch
from specbench.drafters import PromptLookup

PROMPT = [5, 17, 3, 9, 5, 17, 3, 9, 5, 17, 3, 9, 5, 17]


def test_a_token_passes_when_among_the_top_likeliest_and_never_without_mass():
    p = mx.array([[0.5, 0.3, 0.15, 0.05, 0.0], [0.1, 0.2, 0.3, 0.4, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]])
    mx.random.seed(0)
    assert TopKMatch(top=2).path(p, [1, 2], None)[0] == 2  # second likeliest in each row
    assert TopKMatch(top=2).path(p, [1, 0], None)[0] == 1  # 0 is the fourth likeliest of row 1
    n, emitted, probs = TopKMatch(top=3).path(p, [2, 1], None)
    assert n == 2 and emitted[:2] == [2, 1] and probs == [1.0, 1.0]
    assert TopKMatch(top=5).path(p, [4, 0], None)[0] == 0  # p(4) = 0: never kept, whatever top is
    tree_p = mx.concatenate([p, mx.array([[0.25, 0.25, 0.25, 0.25, 0.0]])])
    path, emitted, _ = TopKMatch(top=2).tree(tree_p, [3, 0, 3], [-1, -1, 1], None)
    assert path == [1, 2] and emitted[:2] == [0, 3]  # node 0 (fourth likeliest) fails; 0, then 3 (a tie), pass
    with pytest.raises(ValueError, match="top-k-match top must be an integer >= 1"):
        TopKMatch(top=0)


def test_it_keeps_at_least_what_greedy_matching_keeps_and_more_as_top_grows():
    """The argmax is always among the top tokens, so for any draft the kept prefix is at least the prefix that
    equals the argmax, and it grows with top."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = mx.array(rng.dirichlet(np.full(12, 0.3), size=5).astype(np.float32))
        draft = rng.integers(0, 12, size=4).tolist()
        argmax = np.argmax(np.array(p), axis=-1).tolist()
        greedy = next((i for i in range(4) if draft[i] != argmax[i]), 4)
        kept = [TopKMatch(top=top).path(p, draft, None)[0] for top in (1, 3, 6, 12)]
        assert kept[0] == greedy and kept == sorted(kept)


def test_it_accepts_at_least_what_token_and_exact_match_accept_on_the_tiny_model():
    model = build_tiny("llama", seed=1)
    accepted = {}
    for rule in ("token", "exact-match", "top-k-match"):
        accepted[rule] = 0
        for seed in range(4):
            options = GenerateOptions(max_tokens=16, temperature=1.0, seed=seed, acceptance_rule=rule, ignore_eos=True)
            gen = Generation(model, PROMPT, options, drafter=PromptLookup(), policy=DraftPolicy.fixed(3))
            assert len(list(gen)) == 16
            accepted[rule] += gen.stats()["accepted"]
    assert accepted["top-k-match"] >= max(accepted["token"], accepted["exact-match"]) and accepted["top-k-match"] > 0


def test_it_is_lossy_and_refused_where_plain_sampling_tokens_are_promised():
    rule = rule_for("top-k-match", top=3)
    assert rule == TopKMatch(top=3) and "top-k-match" in rule_names()
    assert not rule.lossless and rule.label == "top-k-match (lossy)"
    options = GenerateOptions(temperature=1.0, seed=0, acceptance_rule=rule, sample_by_position=True)
    with pytest.raises(ValueError, match="acceptance 'top-k-match' cannot give plain sampling's tokens"):
        options.check()


def test_the_command_line_runs_it_and_refuses_it_by_position(capsys):
    from specbench.cli import main

    args = ["generate", "--model", "tiny:smollm2-135m", "--prompt", "Repeat: a b c d a b c d", "--max-tokens", "8"]
    args += ["--temp", "1", "--seed", "0", "--acceptance-rule", "top-k-match", "--policy", "fixed:3"]
    assert main(args) == 0
    assert "accepted" in capsys.readouterr().out
    assert main([*args, "--sample-by-position"]) == 2
    assert "acceptance 'top-k-match' cannot give plain sampling's tokens" in capsys.readouterr().err
