"""The engine's speed, one checkout against another: plain and speculative decoding on the embedded model.

    python3 -m scripts.engine_ab --a ../before --b . [--rounds 6] [--tokens 48] [--repeats 2] [--json PATH]

Each round starts one process per checkout (A and B, their order alternating), each with a home folder of its own
(the embedded model linked in, so neither reads the other's calibrations) and the optimized BLAS preloaded with one
thread. A process loads the model, runs one untimed plain and one speculative generation (calibration, first
compiles), then ``--repeats`` timed ones of each: plain ``generate`` and ``speculative_generate`` with prompt
lookup (``DraftPolicy.fixed(4)``, greedy, the engine's default verify mode) on a prompt lookup predicts. Decode
time is taken from the first emitted token to the last, so prefill does not dilute it. B's tokens/s over A's,
per kind, is the ratio summed over rounds with its 95 % interval over rounds (``bench.paired``): "unchanged
within 2 %" when the interval lies inside [0.98, 1.02], else the interval says what this machine could tell.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from specbench.bench.paired import paired_ratio
from specbench.common.blas import preload_environment
from specbench.common.files import home, write_json_atomic

#: A text whose continuation repeats what it holds, so prompt lookup drafts and most drafts are accepted.
PROMPT = "Repeat the list exactly, three times:\n" + "alpha, beta, gamma, delta, epsilon, zeta, eta, theta; " * 3

#: Runs in each checkout's own Python (the public API both sides share); prints the decode tokens and seconds.
WORKLOAD = """
import json, sys, time
import specbench
from specbench import DraftPolicy, GenerateOptions, PromptLookup
tokens, repeats, prompt = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
model, tokenizer = specbench.load("smollm2-135m")
ids = list(tokenizer.encode(prompt))
options = GenerateOptions(max_tokens=tokens, ignore_eos=True)
kinds = {
    "plain": lambda: specbench.generate(model, ids, options),
    "speculative": lambda: specbench.speculative_generate(
        model, ids, options, drafter=PromptLookup(), policy=DraftPolicy.fixed(4)
    ),
}
def decode(make):
    steps = iter(make())
    next(steps)
    start = time.perf_counter()
    count = sum(1 for _ in steps)
    return count, time.perf_counter() - start
for make in kinds.values():
    decode(make)
totals = {name: [0, 0.0] for name in kinds}
for _ in range(repeats):
    for name, make in kinds.items():
        count, seconds = decode(make)
        totals[name][0] += count
        totals[name][1] += seconds
print("ENGINE_AB " + json.dumps(totals))
"""


def run_side(checkout: Path, home: Path, args: argparse.Namespace) -> dict[str, list[float]]:
    """One process of ``checkout``'s specbench: {kind: [tokens, seconds]}."""
    env = {**(preload_environment() or os.environ), "PYTHONPATH": str(checkout), "SPECBENCH_HOME": str(home)}
    env["OPENBLAS_NUM_THREADS"] = "1"
    command = [sys.executable, "-c", WORKLOAD, str(args.tokens), str(args.repeats), PROMPT]
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("ENGINE_AB ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{checkout}: the workload failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(lines[-1].removeprefix("ENGINE_AB "))


def side_home(root: Path, name: str) -> Path:
    """A home folder with the user's converted models linked in and nothing else."""
    folder = root / name
    (folder / "models").mkdir(parents=True)
    for model in (home() / "models").iterdir():
        (folder / "models" / model.name).symlink_to(model.resolve(), target_is_directory=True)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, type=Path, help="checkout A (the baseline), e.g. a worktree")
    parser.add_argument("--b", default=Path("."), type=Path, help="checkout B (default: this one)")
    parser.add_argument("--rounds", type=int, default=6, help="processes per side, order alternating (>= 6)")
    parser.add_argument("--tokens", type=int, default=48, help="tokens per generation")
    parser.add_argument("--repeats", type=int, default=2, help="timed generations of each kind per process")
    parser.add_argument("--json", type=Path, default=None, help="write the rounds and ratios here")
    args = parser.parse_args(argv)
    for side in (args.a, args.b):
        if not (side / "specbench" / "__init__.py").is_file():
            parser.error(f"{side} is not a specbench checkout (no specbench/__init__.py)")
    if args.rounds < 1 or args.tokens < 2 or args.repeats < 1:
        parser.error("--rounds, --repeats must be >= 1 and --tokens >= 2")
    root = Path(tempfile.mkdtemp(prefix="engine-ab-"))
    homes = {"a": side_home(root, "a"), "b": side_home(root, "b")}
    rounds = []
    for r in range(args.rounds):
        order = ["a", "b"] if r % 2 == 0 else ["b", "a"]
        result = {side: run_side(getattr(args, side).resolve(), homes[side], args) for side in order}
        rounds.append(result)
        print(
            f"round {r + 1}: "
            + "  ".join(
                f"{k} A {result['a'][k][0] / result['a'][k][1]:.1f} tok/s, "
                f"B {result['b'][k][0] / result['b'][k][1]:.1f}"
                for k in ("plain", "speculative")
            ),
            flush=True,
        )
    summary = {}
    for kind in ("plain", "speculative"):
        pairs = [(r, *rounds[r]["a"][kind], *rounds[r]["b"][kind]) for r in range(len(rounds))]
        ratio = paired_ratio(pairs, unit="round")
        inside = ratio.has_interval and 0.98 <= ratio.low and ratio.high <= 1.02
        interval = f"[{ratio.low:.3f}-{ratio.high:.3f}]" if ratio.has_interval else "(no interval: too few rounds)"
        word = "unchanged within 2 %" if inside else "not shown within 2 % at this sample"
        print(f"{kind}: B / A tokens/s {ratio.ratio:.3f} {interval}, {len(rounds)} rounds: {word}")
        summary[kind] = {"ratio": ratio.ratio, "low": ratio.low, "high": ratio.high, "within_2_percent": inside}
    if args.json:
        write_json_atomic(args.json, {"a": str(args.a), "b": str(args.b), "rounds": rounds, "summary": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
