"""One name per concept: every drafter at the root named by its method, the draft length spelled k / max_k,
keyword-only entry points, `bench prompts|trace|batch`; the old spellings are gone (CHANGELOG)."""

from __future__ import annotations

import argparse
import inspect

import pytest
from conftest import ScriptedDrafter, build_tiny, plain_greedy

import specbench
from specbench.cli import main
from specbench.cli.bench import CONFIGURE, MODES
from specbench.core.policies import AdaptivePolicy, DraftPolicy, FixedPolicy
from specbench.cost import breakeven

PROMPT = [5, 17, 3, 9, 5, 17, 3, 9, 5, 17, 44, 2, 8]
DRAFTERS = ("PromptLookup", "SuffixDecoding", "MtpHead", "DraftModel", "EarlyExit", "Oracle")


def test_every_drafter_is_exported_at_the_root_and_named_by_its_method():
    from specbench import drafters

    for name in DRAFTERS:
        assert name in specbench.__all__ and getattr(specbench, name) is getattr(drafters, name)
        assert issubclass(getattr(specbench, name), specbench.Drafter)
    assert {"generate", "generate_batch", "speculative_generate", "speculative_generate_batch"} <= set(
        specbench.__all__
    )


def test_entry_points_take_drafter_and_policy_by_keyword_only():
    for function in (specbench.speculative_generate, specbench.speculative_generate_batch, specbench.generate):
        parameters = list(inspect.signature(function).parameters.values())
        assert [p.name for p in parameters[:2]] in (["model", "prompt"], ["model", "prompts"])
        assert parameters[2].name == "options" and parameters[2].default is None
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[3:]), function.__name__
    batch = inspect.signature(specbench.speculative_generate_batch).parameters
    assert "Any" not in " ".join(str(batch[name].annotation) for name in ("prompts", "drafters", "policy"))


def test_old_spellings_are_gone():
    from specbench import drafters
    from specbench.drafters import mtp, oracle
    from specbench.models import mtp as mtp_modules

    for module, old in (
        (drafters, "MtpDrafter"),
        (drafters, "OracleDrafter"),
        (mtp, "mtp_drafter_for"),
        (oracle, "OracleDrafter"),
        (mtp_modules, "MtpHead"),
    ):
        assert not hasattr(module, old), f"{module.__name__}.{old}"
    model = build_tiny("qwen3")
    with pytest.raises(TypeError):
        specbench.speculative_generate(model, PROMPT, None, ScriptedDrafter([1], len(PROMPT), 97))
    with pytest.raises(TypeError):
        specbench.generate(model, prompt_ids=PROMPT)
    with pytest.raises(TypeError):
        DraftPolicy.fixed(n=3)
    with pytest.raises(TypeError):
        breakeven.best_k(0.9, [1.0, 1.1, 1.3], k_max=2)


def test_keyword_drafter_and_policy_decode_greedily():
    model = build_tiny("qwen3")
    truth = plain_greedy(model, PROMPT, 10)
    options = specbench.GenerateOptions(max_tokens=10)
    drafter = ScriptedDrafter(truth, len(PROMPT), 97)
    out = specbench.speculative_generate(
        model, PROMPT, options, drafter=drafter, policy=DraftPolicy.fixed(3), progress=None
    )
    assert list(out) == truth


def test_the_draft_length_is_k_and_its_bound_max_k():
    assert DraftPolicy.fixed(k=3).k == 3 and DraftPolicy.adaptive(k=5).k == 5
    assert isinstance(FixedPolicy(k=2), FixedPolicy) and isinstance(AdaptivePolicy(4), AdaptivePolicy)
    costs = [1.0, 1.1, 1.3, 1.6, 2.0]
    assert "max_k" in inspect.signature(breakeven.break_even_acceptance).parameters
    assert breakeven.best_k(0.9, costs, max_k=2)[0] <= 2 < breakeven.best_k(0.9, costs, max_k=4)[0]


def _options(mode: str) -> set[str]:
    parser = argparse.ArgumentParser(add_help=False)
    CONFIGURE[mode](parser)
    return {option for option in parser._option_string_actions}


def test_each_bench_mode_parses_only_its_own_options(capsys):
    options = {mode: _options(mode) for mode in MODES}
    assert "--k" in options["prompts"] and "--batch-size" in options["batch"] and "--truncate" in options["trace"]
    for mode, other in (("prompts", "--truncate"), ("prompts", "--batch-size"), ("trace", "--draft-model")):
        assert other not in options[mode]
    for mode, args in (
        ("prompts", ["bundled", "--turns", "2"]),
        ("trace", ["t.jsonl", "--repeats", "2"]),
        ("batch", ["--prompts", "bundled", "--batch-size", "2", "--fresh"]),
        ("prompts", ["--num-draft-tokens", "3"]),
    ):
        assert main(["bench", mode, *args]) == 2
        assert "unrecognized arguments" in capsys.readouterr().err
    assert main(["bench", "batch", "--prompts", "bundled"]) == 2  # B is required
    assert "--batch-size" in capsys.readouterr().err


def test_old_option_spellings_are_refused(tmp_path, capsys):
    missing = tmp_path / "none"
    assert main(["simulate", "--recorded", str(missing), "--prompts", str(missing)]) == 2
    assert "unrecognized arguments" in capsys.readouterr().err
    assert main(["simulate", "--recorded", str(missing)]) == 2
    assert "warning" not in capsys.readouterr().err
    assert main(["bench", "--trace", "t.jsonl"]) == 2
    assert main(["check-exact", "--model", "synthetic:qwen3-8b-tiny", "--k", "2,x"]) == 2
    assert "--k takes a comma list" in capsys.readouterr().err
    assert main(["check-exact", "--model", "synthetic:qwen3-8b-tiny", "--num-prompts", "0"]) == 2
    assert "--num-prompts must be >= 1" in capsys.readouterr().err
