"""One name per concept: every drafter at the root named by its method, the draft length spelled k / max_k,
keyword-only entry points, `bench prompts|trace|batch`; the old spellings work for one release and warn."""

from __future__ import annotations

import argparse
import inspect
import json

import pytest
from conftest import ScriptedDrafter, build_tiny, plain_greedy

import specbench
from specbench.cli import main
from specbench.cli.bench import CONFIGURE, MODES, _flat_bench
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


@pytest.mark.parametrize(
    "module, old, new",
    [
        ("specbench.drafters", "MtpDrafter", "MtpHead"),
        ("specbench.drafters", "OracleDrafter", "Oracle"),
        ("specbench.drafters.mtp", "MtpDrafter", "MtpHead"),
        ("specbench.drafters.mtp", "mtp_drafter_for", "mtp_head_for"),
        ("specbench.drafters.oracle", "OracleDrafter", "Oracle"),
        ("specbench.models.mtp", "MtpHead", "MtpModule"),
    ],
)
def test_an_old_name_is_the_new_object_with_a_warning(module, old, new):
    imported = __import__(module, fromlist=["_"])
    with pytest.warns(FutureWarning, match=rf"{module}\.{old} is deprecated.*use .*{new}"):
        assert getattr(imported, old) is getattr(imported, new)
    with pytest.raises(AttributeError):
        imported.NoSuchName  # noqa: B018


def test_entry_points_take_drafter_and_policy_by_keyword_only():
    for function in (specbench.speculative_generate, specbench.speculative_generate_batch, specbench.generate):
        parameters = list(inspect.signature(function).parameters.values())
        assert [p.name for p in parameters[:2]] in (["model", "prompt"], ["model", "prompts"])
        assert parameters[2].name == "options" and parameters[2].default is None
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters[3:]), function.__name__
    batch = inspect.signature(specbench.speculative_generate_batch).parameters
    assert "Any" not in " ".join(str(batch[name].annotation) for name in ("prompts", "drafters", "policy"))


def test_positional_drafter_and_policy_still_decode_with_a_warning():
    model = build_tiny("qwen3")
    truth = plain_greedy(model, PROMPT, 10)
    options = specbench.GenerateOptions(max_tokens=10)
    with pytest.warns(FutureWarning, match="passing drafter, policy to speculative_generate.*by position"):
        old = specbench.speculative_generate(
            model, PROMPT, options, ScriptedDrafter(truth, len(PROMPT), 97), DraftPolicy.fixed(3), progress=None
        )
    assert list(old) == truth
    with pytest.warns(FutureWarning, match=r"speculative_generate\(prompt_ids=...\).*use prompt="):
        renamed = specbench.speculative_generate(
            model, prompt_ids=PROMPT, options=options, drafter=ScriptedDrafter(truth, len(PROMPT), 97), progress=None
        )
    assert list(renamed) == truth
    with pytest.raises(TypeError, match="both prompt_ids= and prompt="):
        specbench.generate(model, prompt=PROMPT, prompt_ids=PROMPT)


def test_the_draft_length_is_k_and_its_bound_max_k():
    with pytest.warns(FutureWarning, match=r"fixed\(n=...\).*use k="):
        assert DraftPolicy.fixed(n=3).k == 3
    with pytest.warns(FutureWarning, match=r"AdaptivePolicy\.n.*use AdaptivePolicy\.k"):
        assert DraftPolicy.adaptive(k=5).n == 5
    assert isinstance(FixedPolicy(k=2), FixedPolicy) and isinstance(AdaptivePolicy(4), AdaptivePolicy)
    costs = [1.0, 1.1, 1.3, 1.6, 2.0]
    with pytest.warns(FutureWarning, match="use max_k="):
        old = breakeven.break_even_acceptance(costs, k_max=3)
    assert list(old) == list(breakeven.break_even_acceptance(costs, max_k=3))
    with pytest.warns(FutureWarning, match="use max_k="):
        assert breakeven.best_k(0.9, costs, k_max=2) == breakeven.best_k(0.9, costs, max_k=2)


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


@pytest.mark.parametrize(
    "flat, today",
    [
        (["--prompts", "q.jsonl", "--num-draft-tokens", "3"], ["prompts", "q.jsonl", "--k", "3"]),
        (["--trace", "t.jsonl", "--limit=2", "--share-store"], ["trace", "t.jsonl", "--limit", "2", "--share-store"]),
        (
            ["--trace", "t.jsonl", "--batch", "4", "--turns", "1"],
            ["batch", "--trace", "t.jsonl", "--batch-size", "4", "--turns", "1"],
        ),
        (["--prompts", "q.jsonl", "--turns", "2", "--fresh"], ["prompts", "q.jsonl", "--fresh"]),
    ],
)
def test_the_flat_bench_form_becomes_its_mode(flat, today):
    rewritten, notice = _flat_bench(flat)
    assert rewritten == today
    assert notice and "deprecated" in notice and f"specbench bench {' '.join(today)}" in notice
    assert _flat_bench(today) == (today, None)


def test_the_flat_bench_form_still_runs_with_a_warning(tmp_path, capsys, monkeypatch):
    import specbench.models.load as model_loading

    monkeypatch.setattr(model_loading, "load", lambda *a, **k: pytest.fail("the trace is checked before any model"))
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"trace": "a", "turn": 0, "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    assert main(["bench", "--trace", str(trace), "--trace-id", "nope", "--num-draft-tokens", "3"]) == 2
    err = capsys.readouterr().err
    assert "specbench bench: warning: `specbench bench --trace" in err and "use `specbench bench trace" in err
    assert "trace does not read --num-draft-tokens" in err
    assert "specbench bench: error: " in err and "nope" in err  # then the trace mode's own check


def test_old_option_spellings_work_with_a_warning(tmp_path, capsys):
    missing = tmp_path / "none"
    assert main(["simulate", "--prompts", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "specbench simulate: warning: --prompts is deprecated" in err and "use --recorded" in err
    assert main(["simulate", "--recorded", str(missing)]) == 2
    assert "warning" not in capsys.readouterr().err
    assert main(["simulate", "--recorded", str(missing), "--prompts", str(missing)]) == 2
    assert "not allowed with" in capsys.readouterr().err
    assert main(["check-exact", "--model", "synthetic:qwen3-8b-tiny", "--draft-lengths", "2,x"]) == 2
    err = capsys.readouterr().err
    assert "--draft-lengths is deprecated" in err and "use --k" in err and "--k takes a comma list" in err
    assert main(["check-exact", "--model", "synthetic:qwen3-8b-tiny", "--prompts", "0"]) == 2
    err = capsys.readouterr().err
    assert "use --num-prompts" in err and "--num-prompts must be >= 1" in err
