"""`specbench bench`: prompt sets and conversation traces against mlx-lm."""

from __future__ import annotations

import argparse
from pathlib import Path

from specbench.cli.registry import add_model_argument, command, drafter_names, names, verify_modes
from specbench.common.files import check_writable


# -- bench -------------------------------------------------------------------------------------
@command("bench", "benchmark drafters and policies against mlx-lm on prompt sets (--prompts) or traces (--trace)")
def _bench(parser: argparse.ArgumentParser):
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--prompts", help="a Spec-Bench/MT-bench question.jsonl, or 'bundled' for the project's prompts"
    )
    source.add_argument("--trace", help="a trace file to replay turn by turn")
    add_model_argument(parser)
    parser.add_argument("--drafters", "--drafter", default="lookup,suffix", help="comma list: lookup, suffix, mtp")
    parser.add_argument("--policies", "--policy", default="auto,fixed:4", help="comma list: auto, fixed:N, adaptive:N")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of every method per prompt")
    parser.add_argument("--out", default=None, help="folder for parquet, table and figure (resumes there)")
    parser.add_argument("--categories", default=None, help="prompts: comma list of categories to run")
    parser.add_argument("--limit", type=int, default=None, help="prompts: at most N questions per category")
    parser.add_argument("--draft-model", default=None, help="prompts: also run mlx-lm's draft-model speculation")
    parser.add_argument("--num-draft-tokens", type=int, default=2, help="prompts: mlx-lm's draft length")
    parser.add_argument("--verify", default=None, help="prompts: comma list of exact, fast (default: the engine's)")
    parser.add_argument("--fresh", action="store_true", help="prompts: start over instead of resuming in --out")
    parser.add_argument("--turns", type=int, default=None, help="trace: replay only the first N turns of each trace")
    parser.add_argument(
        "--trace-format",
        default=None,
        help="trace: trace, openai, sharegpt, tau-bench, swe-agent or questions (default: detected)",
    )
    parser.add_argument(
        "--share-store",
        action="store_true",
        help="trace: keep each drafter (SuffixDecoding's store) across the file's traces",
    )

    def run(args):
        if args.trace is not None:
            return _bench_trace(args)
        from specbench.core.policies import DraftPolicy
        from specbench.experiments.prompt_bench import bench_prompts
        from specbench.experiments.prompts import questions_from
        from specbench.models.load import load
        from specbench.report.figures.bench import save_prompt_figure

        policies = [DraftPolicy.parse(p) for p in names(args.policies)]
        drafter_names(args.drafters, required=True)
        verify_modes(args.verify)
        categories = names(args.categories) if args.categories else None
        questions = questions_from(args.prompts, categories, args.limit)
        if args.out:
            check_writable(args.out, folder=True, name="--out")
        model, tokenizer = load(args.model)
        draft_model = load(args.draft_model)[0] if args.draft_model else None
        result = bench_prompts(
            model,
            tokenizer,
            questions,
            drafters=names(args.drafters),
            policies=policies,
            max_tokens=args.max_tokens,
            repeats=args.repeats,
            draft_model=draft_model,
            num_draft_tokens=args.num_draft_tokens,
            verify=names(args.verify) if args.verify else (None,),
            model_name=args.model,
            out=args.out,
            fresh=args.fresh,
        )
        if args.out and result.runs:
            save_prompt_figure(result, args.out)
        print()
        print(result.table())
        if args.out:
            print(f"\nresults: {args.out}")

    return run


def _bench_trace(args):
    """``bench --trace``: replay traces turn by turn, plain decoding against each drafter."""
    from specbench.core.options import GenerateOptions
    from specbench.core.policies import DraftPolicy
    from specbench.experiments.trace_bench import format_turns, run_trace
    from specbench.models.load import load

    verify = verify_modes(args.verify)
    if len(verify) > 1:
        raise ValueError("--trace takes one --verify mode (exact or fast)")
    policies = [DraftPolicy.parse(p) for p in names(args.policies)]
    drafter_names(args.drafters, required=True)
    options = GenerateOptions(max_tokens=args.max_tokens, verify=verify[0] if verify else None)
    if args.turns is not None and args.turns < 1:
        raise ValueError(f"--turns must be >= 1, got {args.turns}")
    trace = Path(args.trace)
    if not trace.is_file():
        raise FileNotFoundError(f"no trace file at {trace}" + (" (it is a folder)" if trace.is_dir() else ""))
    if args.out:
        check_writable(args.out, folder=True, name="--out")
    model, tokenizer = load(args.model)
    result = run_trace(
        model,
        tokenizer,
        args.trace,
        drafters=names(args.drafters),
        policies=policies,
        max_tokens=args.max_tokens,
        options=options,
        turns=args.turns,
        out=args.out,
        format=args.trace_format,
        share_store=args.share_store,
        model_name=args.model,
    )
    print()
    print(format_turns(result.turns))
    print()
    print(result.table())
    if not result.identical:
        print("\nWARNING: some drafter output differed from plain decoding (see the 'identical' column)")
    if args.out:
        print(f"\nresults: {args.out}")
    return 0 if result.identical else 1
