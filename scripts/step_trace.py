"""What one default speculative step runs: specbench functions, calls, source lines and call depth, per step.

    python3 -m scripts.step_trace [--tokens 60]

The generation is as tests/test_step_files.py's: greedy, exact verification, ``DraftPolicy.auto()``, prompt lookup,
on a tiny random-weight model (``qwen3-8b-tiny``, 2 layers) whose next token depends on the current token alone
(attention and MLP outputs zeroed), prompted with its own output (so lookup finds every draft), traced with
``sys.setprofile`` after its first 12 tokens (calibration, profiles and first builds behind it), over the next
--tokens tokens: the distinct specbench functions called (and their files and source lines), the calls per step (per
record the step log gained) and the deepest stack of specbench calls. Run it in two checkouts to compare the step
before and after a change.
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys

import mlx.core as mx

import specbench
from specbench import DraftPolicy, GenerateOptions, generate, speculative_generate
from specbench.drafters import PromptLookup
from specbench.models import synthetic


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=60)
    args = parser.parse_args()
    model = synthetic.build("qwen3-8b-tiny", layers=2, seed=2)
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight = mx.zeros_like(layer.self_attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
    options = GenerateOptions(max_tokens=40, ignore_eos=True, verify="exact")
    prompt = [5] + list(generate(model, [5], options))
    options = GenerateOptions(max_tokens=80, ignore_eos=True, verify="exact")
    generation = speculative_generate(
        model, prompt, options, drafter=PromptLookup(), policy=DraftPolicy.auto(), progress=None
    )
    gen = iter(generation)
    for _ in range(12):
        next(gen)
    root = os.path.dirname(specbench.__file__)
    functions: set = set()
    calls, depth, deepest = 0, 0, 0

    def profile(frame, event, arg) -> None:
        nonlocal calls, depth, deepest
        if not frame.f_code.co_filename.startswith(root):
            return
        if event == "call":
            functions.add(frame.f_code)
            calls += 1
            depth += 1
            deepest = max(deepest, depth)
        elif event == "return":
            depth -= 1

    logged = len(generation.log)
    sys.setprofile(profile)
    try:
        for _ in range(args.tokens):
            next(gen)
    finally:
        sys.setprofile(None)
    steps = len(generation.log) - logged
    lines = sum(len(inspect.getsourcelines(code)[0]) for code in functions)
    files = {os.path.relpath(code.co_filename, root) for code in functions}
    print(
        f"{args.tokens} tokens in {steps} steps: {len(functions)} specbench functions in {len(files)} files "
        f"({lines} source lines), {calls / max(steps, 1):.0f} calls a step, deepest specbench stack {deepest}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
