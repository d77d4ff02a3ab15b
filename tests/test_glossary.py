"""One name per concept (docs/glossary.md): the spellings the package dropped stay out of specbench/, a rule is
named a rule, the verify mode keeps its name along the call path from ``speculative_generate``, and the names the
glossary gives exist."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import tokenize
from pathlib import Path

import specbench
from specbench.core.options import GenerateOptions
from specbench.cost.breakeven import BreakEven
from specbench.cost.measure import lockstep_profile, profile_for
from specbench.cost.trees import stored_tree_costs
from specbench.decoding import break_even_function
from specbench.exact.verifier import verifier_for

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specbench"
GLOSSARY = ROOT / "docs" / "glossary.md"

#: Identifiers that named a concept the glossary names otherwise; each was in the package and is gone.
BANNED = {
    "Acceptance": "AcceptanceRule (the rule with its parameters; acceptance alone is a rate)",
    "k_max": "max_k (the bound on the draft length)",
    "num_draft_tokens": "k (the draft length)",
    "plain_generate": "plain_generation (specbench.generate is the one function named generate)",
}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "assets" not in p.relative_to(PACKAGE).parts)


def identifiers(path: Path) -> list[tuple[int, str]]:
    """The names in ``path``'s code (strings, docstrings and comments left out), with their lines."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    return [(t.start[0], t.string) for t in tokens if t.type == tokenize.NAME]


def test_dropped_spellings_stay_out_of_the_package():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name} (use {BANNED[name]})"
        for path in modules()
        for line, name in identifiers(path)
        if name in BANNED
    ]
    assert not found, "spellings docs/glossary.md replaced:\n  " + "\n  ".join(found)


def test_a_rule_is_named_rule():
    """A parameter holding an acceptance rule is ``rule``/``rules``; ``acceptance`` is a rate. GenerateOptions
    chooses the rule with ``acceptance_rule``."""
    misnamed = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in [*node.args.args, *node.args.kwonlyargs]:
                    annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                    if "AcceptanceRule" in annotation and not arg.arg.startswith("rule"):
                        misnamed.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}({arg.arg}: {annotation})")
    assert not misnamed, "acceptance rules under another name:\n  " + "\n  ".join(misnamed)
    fields = {f.name for f in dataclasses.fields(GenerateOptions)}
    assert "acceptance_rule" in fields and "acceptance" not in fields


def test_the_verify_mode_keeps_its_name_along_the_call_path():
    """speculative_generate hands options.verify_mode down as ``verify`` at every call, never as ``mode``."""
    for function in (verifier_for, profile_for, lockstep_profile, stored_tree_costs, break_even_function, BreakEven):
        parameters = inspect.signature(function).parameters
        assert "verify" in parameters and "mode" not in parameters, function.__qualname__
    tree = ast.parse(inspect.getsource(specbench.decoding.speculative_generate))
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert "verify" in names and "mode" not in names


def test_one_class_named_mtp_head_and_one_function_named_generate():
    defined: dict[str, list[str]] = {"MtpHead": [], "generate": []}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in defined:
                defined[node.name].append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert len(defined["MtpHead"]) == 1 and defined["MtpHead"][0].startswith("specbench/drafters/"), defined
    assert defined["generate"] == [f"specbench/decoding.py:{specbench.generate.__code__.co_firstlineno}"], defined


def test_the_glossary_names_what_the_package_spells():
    """Every identifier in the glossary's code column is a name in the package's code (c(w) is notation)."""
    names = {name for path in modules() for _, name in identifiers(path)}
    rows = [line.split("|") for line in GLOSSARY.read_text(encoding="utf-8").splitlines() if line.startswith("| ")]
    code = {word for row in rows[1:] for word in re.findall(r"`([A-Za-z_][\w.]*)`", row[2])}
    assert len(rows) >= 12 and {"AcceptanceRule", "max_k", "verify", "tokens_per_verify"} <= code
    missing = sorted(word for word in code if word.split(".")[-1] not in names)
    assert not missing, f"docs/glossary.md names what specbench/ does not spell: {missing}"
    assert not set(BANNED) & code


def test_no_two_classes_of_the_package_share_a_name():
    """One name per concept: two classes of one name (an A/B arm and a prompt bench's method; an output divergence
    and an audited operation's) read as one concept wherever either is imported."""
    seen: dict[str, list[str]] = {}
    for path in sorted(Path(specbench.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name, []).append(str(path))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
