"""`specbench ab`: the paired A/B experiment (Auto against plain, or any two methods) on this machine."""

from __future__ import annotations

import argparse

from specbench.cli.registry import add_model_argument, command, names


@command(
    "ab",
    "paired A/B runs on this machine: B's speed over A's on the same prompts, with a 95 % interval and a verdict "
    "(B pays, loses, or the interval cannot tell); --aa runs A against itself to show the machine's noise",
)
def _ab(parser: argparse.ArgumentParser):
    add_model_argument(parser, shard=False)
    parser.add_argument("--a", default="plain", help="method A: plain, a drafter (under Auto) or DRAFTER/POLICY")
    parser.add_argument("--b", default="lookup/auto", help="method B, as --a")
    parser.add_argument("--aa", action="store_true", help="A against A: the machine's run-to-run noise")
    parser.add_argument("--categories", default="qa,translation", help="comma list of bundled prompt categories")
    parser.add_argument("--limit", type=int, default=3, help="prompts per category")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per call")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over the prompts (pairs = prompts x repeats)")
    parser.add_argument("--verify", choices=("exact", "fast"), help="verify mode (default: the engine's)")
    parser.add_argument("--pin", action="store_true", help="first keep the steadier of free and pinned cores")

    def run(args):
        from specbench.bench.ab_experiment import Arm, run_ab
        from specbench.bench.timing import clocked
        from specbench.common.timing import steadier_affinity
        from specbench.core.engine import plain_generation
        from specbench.core.options import GenerateOptions
        from specbench.inputs.prompts import bundled_questions, render_prompt
        from specbench.models.load import load

        a = Arm.parse(args.a, "--a")
        b = a if args.aa else Arm.parse(args.b, "--b")
        if args.repeats < 1 or args.limit < 1 or args.max_tokens < 2:
            raise ValueError("--repeats and --limit take at least 1, --max-tokens at least 2")
        questions = bundled_questions(names(args.categories), args.limit)  # unknown categories: an error here
        model, tokenizer = load(args.model)
        prompts = [render_prompt(tokenizer, q.turns[0]) for q in questions]
        options = GenerateOptions(max_tokens=args.max_tokens, verify=args.verify)
        print(f"{args.model}: {len(prompts)} prompts x {args.repeats} repeats, {b} against {a}", flush=True)
        if args.pin:

            def plain() -> float:
                return clocked(lambda: plain_generation(model, prompts[0], options, tokenizer=tokenizer)).wall_s

            print(f"timed runs {steadier_affinity(plain, say=print).chosen}")
        result = run_ab(model, tokenizer, prompts, a, b, options, args.repeats, say=lambda t: print(t, flush=True))
        for line in result.lines():
            print(line)
        return 0

    return run
