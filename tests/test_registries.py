"""One registry per extension point: a drafter, an acceptance rule or a policy registered anywhere is a choice
everywhere (the command line's choices and help, the benches' and the simulator's checks, the rule comparison,
``DraftPolicy.parse``) with no other edit; and the two examples of docs/extending.md are named only in their module,
their test and that page."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import mlx.core as mx
import pytest

from specbench.bench.prompt_runs import prompt_methods
from specbench.checks.acceptance_rules import rule_list
from specbench.cli import main
from specbench.cli.registry import drafter_names
from specbench.core.draft import Draft, Drafter
from specbench.core.options import GenerateOptions
from specbench.core.policies import PEERS, DraftPolicy, FixedPolicy
from specbench.core.rules import RULES, PassingRule, register_rule, rule_for
from specbench.drafters import DRAFTERS, make_drafter, register_drafter
from specbench.inputs.capabilities import usable_drafters
from specbench.report.explorer import Choice
from specbench.simulate.simulate import model_free_drafter

ROOT = Path(__file__).resolve().parents[1]
GENERATE = ["generate", "--model", "tiny:smollm2-135m", "--prompt", "Repeat: a b c d a b c d", "--max-tokens", "6"]


class Repeat(Drafter):
    """Drafts the last token again."""

    name = "repeat-test"

    def draft(self, context, k):
        return Draft([int(context[-1])] * k)


@pytest.fixture
def repeat_drafter():
    @register_drafter("repeat-test", "drafts the last token again (a test's drafter)")
    def build(inputs):
        return Repeat()

    yield "repeat-test"
    DRAFTERS.remove("repeat-test")


@pytest.fixture
def lenient_rule():
    @register_rule
    @dataclass(frozen=True)
    class Lenient(PassingRule):
        name: ClassVar[str] = "lenient-test"
        description: ClassVar[str] = "keeps every drafted token p gives mass (a test's rule)"

        def passes(self, p, tokens):
            return mx.take_along_axis(p, tokens[:, None], axis=-1)[:, 0] > 0

    yield Lenient
    RULES.remove("lenient-test")


def _help(capsys, *command: str) -> str:
    """The help ``specbench COMMAND --help`` prints, on one line."""
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_a_registered_drafter_is_a_choice_everywhere(repeat_drafter, capsys):
    assert isinstance(make_drafter(repeat_drafter), Repeat)
    for command in (["generate"], ["bench", "prompts"], ["profile"], ["simulate"]):  # simulate: it needs no model
        assert repeat_drafter in _help(capsys, *command), command
    assert drafter_names(f"lookup,{repeat_drafter}") == ["lookup", repeat_drafter]
    assert [m.drafter for m in prompt_methods([repeat_drafter]) if m.drafter]  # the bench takes it
    factories, skipped = usable_drafters([repeat_drafter])
    assert isinstance(factories[repeat_drafter](), Repeat) and not skipped
    assert isinstance(model_free_drafter(repeat_drafter, 4), Repeat)
    Choice(drafter=repeat_drafter).check()  # the log explorer offers it
    assert main([*GENERATE, "--drafter", repeat_drafter, "--policy", "fixed:2"]) == 0
    assert "drafted" in capsys.readouterr().out
    DRAFTERS.remove(repeat_drafter)
    assert main([*GENERATE, "--drafter", repeat_drafter]) == 2
    assert f"unknown drafter '{repeat_drafter}'" in capsys.readouterr().err


def test_a_registered_rule_is_a_choice_everywhere_with_its_parameters_in_the_object(lenient_rule, capsys):
    assert "lenient-test: keeps every drafted token" in _help(capsys, "generate")
    assert lenient_rule() in rule_list() and rule_for("lenient-test").label == "lenient-test (lossy)"
    GenerateOptions(temperature=1.0, acceptance_rule="lenient-test").check()
    with pytest.raises(ValueError, match="acceptance 'lenient-test' cannot give plain sampling's tokens"):
        GenerateOptions(temperature=1.0, seed=0, acceptance_rule=lenient_rule(), sample_by_position=True).check()
    assert main([*GENERATE, "--temp", "1", "--seed", "0", "--acceptance-rule", "lenient-test"]) == 0
    assert "accepted" in capsys.readouterr().out


def test_a_registered_policy_is_parsed_by_name():
    class Twice(FixedPolicy):
        @classmethod
        def from_text(cls, text):
            return cls(2 * int(text or 1))

    PEERS.add("twice-test", Twice)
    try:
        assert DraftPolicy.parse("twice-test:3").k == 6 and "twice-test[:...]" in str(_unknown_policy())
    finally:
        PEERS.remove("twice-test")
    assert "twice-test" not in str(_unknown_policy())


def _unknown_policy() -> ValueError:
    with pytest.raises(ValueError) as raised:
        DraftPolicy.parse("sometimes")
    return raised.value


#: The examples of docs/extending.md, each with the three files allowed to name it.
EXAMPLES = {
    ("ngram-cache", "NgramCache", "ngram_cache"): (
        "specbench/drafters/ngram_cache.py",
        "tests/drafters/test_ngram_cache.py",
        "docs/extending.md",
    ),
    ("top-k-match", "TopKMatch", "top_k_match"): (
        "specbench/core/rules/top_k_match.py",
        "tests/core/test_top_k_match.py",
        "docs/extending.md",
    ),
}


def test_each_example_is_named_in_its_module_its_test_and_one_doc_page_alone():
    files = [
        p
        for folder in ("specbench", "scripts", "notebooks", "tests", "docs")
        for p in (ROOT / folder).rglob("*")
        if p.is_file()
        and p.suffix in (".py", ".ipynb", ".md", ".json", ".toml", ".yaml")
        and p.name != Path(__file__).name
    ] + [ROOT / "README.md"]
    for spellings, allowed in EXAMPLES.items():
        naming = {str(p.relative_to(ROOT)) for p in files if any(s in p.read_text(encoding="utf-8") for s in spellings)}
        assert naming == set(allowed), f"{spellings[0]} is named outside its own files: {sorted(naming - set(allowed))}"
