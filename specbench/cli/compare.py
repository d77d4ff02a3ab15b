"""`specbench compare A B`: two recorded runs, or two models on the same prompts, side by side; `specbench ab`: the
paired A/B experiment (Auto against plain, or any two methods) on this machine."""

from __future__ import annotations

import argparse

from specbench.cli.registry import add_model_argument, command, device_defaults, drafter_names, names, prompt_selection


@command(
    "compare",
    "set two runs side by side (recorded prompt benchmarks, or two models run here on the same prompts): acceptance "
    "per position and per prompt kind, tokens per verification, speedup, c(w), each A - B with a 95 % interval "
    "and a verdict; where the outputs first differ",
)
def _compare(parser: argparse.ArgumentParser):
    parser.add_argument(
        "a", help="run A: a folder of `specbench bench prompts --out`, or a model (short name, folder or mlx-lm id)"
    )
    parser.add_argument("b", help="run B, as A (both folders of recorded runs, or both models)")
    parser.add_argument(
        "--prompts",
        default="bundled",
        help="for two models: a Spec-Bench/MT-bench question.jsonl, or 'bundled' for the project's prompts",
    )
    prompt_selection(parser, "for two models: ")
    parser.add_argument("--drafter", default="lookup", help="for two models: the drafter both run")
    parser.add_argument("--policy", default="fixed:3", help="for two models: the draft policy both run")
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="for two models: tokens per prompt (default: 128; 32 on a CPU)"
    )
    parser.add_argument(
        "--verify", choices=("exact", "fast"), help="for two models: verify mode (default: the engine's)"
    )
    parser.add_argument(
        "--method", default=None, help="the method to compare, e.g. lookup/fixed:3 (default: the first both ran)"
    )
    parser.add_argument(
        "--out",
        default=None,
        help="folder for the comparison (table, parquet, figure) and, for two models, their recorded runs",
    )

    def run(args: argparse.Namespace) -> int:
        from specbench.bench.compare import compare, run_models
        from specbench.bench.prompt_bench import is_recorded_run, load_prompt_bench
        from specbench.cli.registry import draw_figure
        from specbench.common.files import check_writable

        recorded = [is_recorded_run(args.a), is_recorded_run(args.b)]
        if recorded[0] != recorded[1]:
            one, other = (args.a, args.b) if recorded[0] else (args.b, args.a)
            raise ValueError(
                f"{one} is a recorded run and {other} is not: compare two folders of `specbench bench prompts --out`, "
                "or two models"
            )
        if args.out:
            check_writable(args.out, folder=True, name="--out")
        if all(recorded):
            runs = [load_prompt_bench(args.a), load_prompt_bench(args.b)]
            labels = _labels(args.a, args.b, [str(run.info.get("model", "")) for run in runs])
        else:
            from specbench.core.policies import DraftPolicy
            from specbench.inputs.prompts import questions_from
            from specbench.models.load import check_model

            device_defaults(args)
            drafter_names(args.drafter, option="--drafter", required=True)
            if len(names(args.drafter)) != 1:
                raise ValueError(f"--drafter takes one drafter, got {args.drafter!r}")
            DraftPolicy.parse(args.policy)
            for model in (args.a, args.b):
                check_model(model)
            questions = questions_from(args.prompts, names(args.categories) if args.categories else None, args.limit)
            runs = run_models(
                [args.a, args.b],
                questions,
                drafter=args.drafter,
                policy=args.policy,
                max_tokens=args.max_tokens,
                verify=args.verify,
                out=args.out,
            )
            labels = (args.a, args.b)
        comparison = compare(runs[0], runs[1], args.method, *labels)
        print()
        print(comparison.table())
        print(f"\nVerdict: {comparison.verdict()}")
        if args.out:
            comparison.save(args.out)
            draw_figure("compare", "save_compare_figure", comparison, args.out)
            print(f"\nresults: {args.out}")
        return 0

    return run


def _labels(a: str, b: str, models: list[str]) -> tuple[str, str]:
    """Short names of two recorded runs: their models' names where those differ, else their folders' names, else
    their paths."""
    from pathlib import Path

    if models[0] and models[1] and models[0] != models[1]:
        return models[0], models[1]
    folders = Path(a).resolve().name, Path(b).resolve().name
    return folders if folders[0] != folders[1] else (a, b)


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
