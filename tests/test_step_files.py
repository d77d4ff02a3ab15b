"""One default speculative step stays readable: the files of specbench it runs code in are those the one-line
description of the step names.

The step is traced as ``sys.setprofile`` sees it (every Python function called, by the file that defines it) in
the middle of a default generation: greedy, exact verification, ``DraftPolicy.auto()``, prompt lookup, on a
tiny model whose next token depends on the current token alone (its attention and MLP outputs zeroed: the
layers still run), prompted with its own output, so that lookup finds every draft and most are accepted.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import mlx.core as mx
from conftest import build_tiny, plain_greedy

import specbench
from specbench import DraftPolicy, GenerateOptions, speculative_generate
from specbench.drafters import PromptLookup

#: The step in one line, naming every file of specbench it runs code in: README.md's "How one step runs".
README = Path(__file__).resolve().parents[1] / "README.md"


def readme_step() -> str:
    """The README's paragraph that starts "How one step runs", after its first line, up to the blank line."""
    text = README.read_text(encoding="utf-8")
    start = text.index("\n", text.index("How one step runs"))
    return text[start : text.index("\n\n", start)]


#: The most files the step may cross (gpt-fast's and mlx-lm's speculative steps cross 2): 8, and the exact
#: verifier's own forward since exactness fails closed (each verification checks its width was probed at this
#: cache length, and samples the audit).
MAX_STEP_FILES = 9


def named_files(line: str) -> set[str]:
    return set(re.findall(r"[\w/]+\.py", line))


def traced_step_files(steps: int = 24) -> set[str]:
    """The files of specbench whose functions run during ``steps`` speculative steps of a default generation."""
    model = build_tiny("llama", seed=2)
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight = mx.zeros_like(layer.self_attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
    prompt = [5] + plain_greedy(model, [5], 40)
    options = GenerateOptions(max_tokens=80, ignore_eos=True, verify="exact")
    gen = iter(
        speculative_generate(model, prompt, options, drafter=PromptLookup(), policy=DraftPolicy.auto(), progress=None)
    )
    for _ in range(12):  # past the prompt and the first decisions: calibration, profiles, first builds
        next(gen)
    root = os.path.dirname(specbench.__file__)
    files: set[str] = set()

    def profile(frame, event, arg) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(root):
            files.add(os.path.relpath(frame.f_code.co_filename, root))

    sys.setprofile(profile)
    try:
        for _ in range(steps):
            next(gen)
    finally:
        sys.setprofile(None)
    return files


def test_one_default_step_crosses_only_the_files_its_description_names():
    named = named_files(readme_step())
    assert len(named) <= MAX_STEP_FILES, f"the step's description names {len(named)} files: {sorted(named)}"
    traced = traced_step_files()
    assert traced, "the trace saw no specbench code"
    assert traced <= named, f"the step now also runs code in {sorted(traced - named)}: {sorted(traced)}"
