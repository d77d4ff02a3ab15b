"""Early exit: the target's first layers draft with its own weights; greedy exactness, losslessness,
the sweep over exit depths."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import MIMO, build, build_tiny

from scripts.gpu.draft_training import draft_from_target
from scripts.gpu.drafter_eval import best_exit_layer, sweep_exit_layers
from specbench.checks.lossless import histogram_test, lossless_verdict, well_filled_share
from specbench.core.accept import SamplingSettings
from specbench.core.engine import Generation, plain_generation
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.drafters import EarlyExit, is_drafter_name, make_drafter

PROMPT = [5, 17, 33, 2, 9, 41, 8]


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe"])
def test_greedy_equals_plain_decoding(arch):
    target = build_tiny(arch, num_hidden_layers=3)
    drafter = EarlyExit(target, 2)
    # The drafter computes the target's first two layers with the target's own modules.
    assert drafter.model is target
    tokens = mx.array([PROMPT])
    assert mx.allclose(drafter._logits(tokens, drafter._new_cache()), draft_from_target(target, [0, 1])(tokens))
    options = GenerateOptions(max_tokens=30)
    gen = Generation(target, PROMPT, options, drafter=drafter, policy=DraftPolicy.fixed(3))
    assert list(gen) == list(plain_generation(target, PROMPT, options))
    assert gen.stats()["drafted"] > 0
    assert 0 < drafter.cost_per_token < 1


def test_sampling_is_lossless_with_its_q():
    target = build_tiny("llama", num_hidden_layers=3, scale=1.5)
    settings = SamplingSettings(temperature=1.0)
    plain, spec = [], []
    accepted = 0
    for i in range(40):
        options = GenerateOptions(max_tokens=6, temperature=1.0, seed=i, ignore_eos=True)
        plain.append(list(plain_generation(target, PROMPT, options)))
        options = GenerateOptions(max_tokens=6, temperature=1.0, seed=1000 + i, ignore_eos=True)
        gen = Generation(
            target, PROMPT, options, drafter=EarlyExit(target, 2, sampling=settings), policy=DraftPolicy.fixed(3)
        )
        spec.append(list(gen))
        accepted += gen.stats()["accepted"]
        assert all(r.accept_probs for r in gen.log if r.kind == "verify")
    _, p, _ = histogram_test(plain, spec, permutations=400)
    verdict, reason = lossless_verdict(p, accepted, well_filled_share(plain, spec))
    assert verdict == "pass", reason


def test_sweep_measures_each_depth_and_picks_one():
    target = build_tiny("llama", num_hidden_layers=4)
    rows = sweep_exit_layers(target, [PROMPT, PROMPT[::-1]], layers=[1, 3], k=2, max_tokens=12)
    assert [r["layers"] for r in rows] == [1, 3]
    for r in rows:
        assert r["verifies"] > 0
        assert all(0 <= a <= 1 for a in r["per_position_acceptance"])
        assert r["cost_per_token"] > 0
    assert rows[0]["cost_per_token"] < rows[1]["cost_per_token"]
    assert best_exit_layer(rows) in (1, 3)


def test_names_and_bad_input():
    target = build_tiny("llama", num_hidden_layers=4)
    assert make_drafter("early-exit:3", model=target).layers == 3
    assert make_drafter("early-exit", model=target).layers == 2
    assert is_drafter_name("early-exit:3") and not is_drafter_name("early-exit:x")
    with pytest.raises(ValueError, match="1 <= layers < 4"):
        EarlyExit(target, 4)
    with pytest.raises(ValueError, match="early exit supports"):
        EarlyExit(build(MIMO), 1)
