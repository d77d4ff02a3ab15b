"""The front door and the guides: the README within its limits, every notebook listed, every Python example run
and every command line parsed by the CLI's own parser.

A Python block preceded by the line ``<!-- docs-test: tiny -->`` runs with ``load("NAME")`` replaced by
``load("tiny:NAME")``: the same code on a two-layer random-weight miniature of the model (its real tokenizer),
so the examples run in seconds on a CPU. The blocks of one file run in order, in one namespace.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import warnings
from pathlib import Path

import pytest

from specbench.cli.registry import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDES = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, *GUIDES, ROOT / "notebooks" / "README.md"]
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))

MAX_LINES, MAX_WORDS, MAX_LINE_CHARS = 150, 1500, 120
TINY_MARKER = "<!-- docs-test: tiny -->"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
EMBEDDED_LOAD = re.compile(r"""\bload\("([\w.-]+)"\)""")


def fenced_blocks(path: Path, language: str) -> list[tuple[str, bool]]:
    """The ``language`` blocks of a Markdown file: (code, whether the tiny-model marker precedes it)."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        if match.group(1) == language:
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            blocks.append((match.group(2), before.strip() == TINY_MARKER))
    return blocks


def on_tiny_model(code: str) -> str:
    """``code`` with every ``load("NAME")`` loading the miniature ``tiny:NAME``; an error where none does."""
    swapped, count = EMBEDDED_LOAD.subn(r'load("tiny:\1")', code)
    assert count, f"a block marked {TINY_MARKER} loads no model by name:\n{code}"
    return swapped


def test_readme_within_limits():
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"
    assert len(text.split()) <= MAX_WORDS, f"README.md has {len(text.split())} words (at most {MAX_WORDS})"
    long = [(n, len(line)) for n, line in enumerate(lines, 1) if len(line) > MAX_LINE_CHARS]
    assert not long, f"README.md lines over {MAX_LINE_CHARS} characters (line, length): {long}"


def test_readme_opens_with_the_two_commands():
    first_block = FENCE.search(README.read_text(encoding="utf-8"))
    commands = [line.split("#")[0].strip() for line in first_block.group(2).splitlines()]
    assert commands == ["make report", "make test"]


@pytest.mark.parametrize("document", [README, ROOT / "notebooks" / "README.md"], ids=lambda p: p.parent.name)
def test_every_notebook_listed(document: Path):
    listed = set(re.findall(r"^\| `(\w+)` \|", document.read_text(encoding="utf-8"), re.M))
    assert NOTEBOOKS and set(NOTEBOOKS) <= listed, f"not listed in {document}: {sorted(set(NOTEBOOKS) - listed)}"
    assert listed <= set(NOTEBOOKS), f"listed in {document} but not in notebooks/: {sorted(listed - set(NOTEBOOKS))}"


def test_links_resolve():
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#]+)\)", text) + re.findall(r"^\[[^\]]+\]: (\S+)", text, re.M):
            if "://" not in target:
                assert (document.parent / target).exists(), f"{document.name} links to a missing {target}"


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if fenced_blocks(d, "python")], ids=lambda p: p.name)
def test_python_examples_run(document: Path):
    namespace: dict = {"__name__": f"docs_{document.stem}"}
    for code, tiny in fenced_blocks(document, "python"):
        source = on_tiny_model(code) if tiny else code
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)  # the examples use today's names, not deprecated ones
            exec(compile(source, f"{document.name} example", "exec"), namespace)


class _Rejected(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise _Rejected(f"{self.prog}: {message}")


def cli_parser() -> argparse.ArgumentParser:
    """The ``specbench`` parser as ``specbench.cli.main`` builds it, to parse without running."""
    parser = _Parser(prog="specbench")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (_, configure) in COMMANDS.items():
        configure(sub.add_parser(name))
    return parser


def command_lines() -> list[tuple[str, str]]:
    """(file, the arguments after ``specbench``) of every ``specbench`` line of the documents' bash blocks."""
    found = []
    for document in DOCUMENTS:
        for code, _ in fenced_blocks(document, "bash"):
            for line in code.splitlines():
                words = shlex.split(line, comments=True)
                if "specbench" in words:
                    found.append((document.name, shlex.join(words[words.index("specbench") + 1 :])))
    return found


def test_command_lines_parse():
    lines = command_lines()
    assert len(lines) >= 10
    parser = cli_parser()
    for name, line in lines:
        try:
            parser.parse_args(shlex.split(line))
        except _Rejected as err:
            pytest.fail(f"{name}: `specbench {line}` does not parse: {err}")
