"""`specbench bench`: prompt sets and conversation traces against mlx-lm."""

from __future__ import annotations

import argparse
from pathlib import Path

from specbench.cli.registry import add_model_argument, command, device_defaults, drafter_names, names, verify_modes
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
    parser.add_argument(
        "--drafters",
        "--drafter",
        default="lookup,suffix",
        help="comma list: lookup, suffix, mtp, draft-model, early-exit:L",
    )
    parser.add_argument("--policies", "--policy", default="auto,fixed:4", help="comma list: auto, fixed:N, adaptive:N")
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="tokens per prompt or turn (default: 128; 32 on a CPU)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of every method per prompt")
    parser.add_argument("--out", default=None, help="folder for parquet, table and figure (resumes there)")
    parser.add_argument(
        "--categories",
        default=None,
        help="prompts: comma list of categories to run (default: all; qa,translation on a CPU with --prompts bundled)",
    )
    parser.add_argument(
        "--limit",
        type=int,
        default=None,
        help="prompts: at most N questions per category; trace: at most N traces (default: all; 1 on a CPU)",
    )
    parser.add_argument(
        "--draft-model",
        default=None,
        help="prompts: a draft model (a name, a folder, a draft .safetensors, or 'shipped'): specbench's "
        "draft-model and mlx-lm's speculation with it",
    )
    parser.add_argument("--num-draft-tokens", type=int, default=2, help="prompts: mlx-lm's draft length")
    parser.add_argument("--verify", default=None, help="prompts: comma list of exact, fast (default: the engine's)")
    parser.add_argument("--fresh", action="store_true", help="prompts: start over instead of resuming in --out")
    parser.add_argument("--turns", type=int, default=None, help="trace: replay only the first N turns of each trace")
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="B requests at a time (the prompts, or every turn of the traces) for each drafter and policy, "
        "vs plain batched decoding and mlx-lm batch_generate",
    )
    parser.add_argument(
        "--trace-format",
        default=None,
        help="trace: trace, openai, runs, sharegpt, tau-bench, swe-agent or questions (default: detected)",
    )
    parser.add_argument("--trace-id", default=None, help="trace: comma list of the trace ids to replay (default: all)")
    parser.add_argument(
        "--truncate",
        choices=("oldest",),
        default=None,
        help="trace: drop a turn's oldest messages to fit the model's context (default: an error naming the turn)",
    )
    parser.add_argument(
        "--share-store",
        action="store_true",
        help="trace: keep each drafter (SuffixDecoding's store) across the file's traces",
    )

    def run(args):
        from specbench.report.progress import Heartbeat

        with Heartbeat("specbench bench"):  # a line every 30 s, so that no stretch of the run is silent
            return bench(args)

    def bench(args):
        device_defaults(args)  # on a CPU: a run of minutes unless asked for more
        if args.batch is not None:
            from specbench.bench.batch_bench import bench_batch_source

            bench_batch_source(
                args.model,
                args.batch,
                prompts=args.prompts,
                trace=args.trace,
                drafters=drafter_names(args.drafters, required=True),
                policies=names(args.policies),
                max_tokens=args.max_tokens,
                categories=names(args.categories) if args.categories else None,
                limit=args.limit,
                trace_format=args.trace_format,
                trace_ids=names(args.trace_id or "") or None,
                turns=args.turns,
                out=args.out,
                verify=args.verify,
            )
            return 0
        if args.trace is not None:
            return _bench_trace(args)
        from specbench.bench.bench_ranks import bench_prompts_over_ranks
        from specbench.common import distributed
        from specbench.core.policies import DraftPolicy
        from specbench.drafters.draft_model import resolve_draft_model
        from specbench.inputs.prompts import questions_from
        from specbench.models.load import load
        from specbench.report.figures.bench import save_prompt_figure

        policies = [DraftPolicy.parse(p) for p in names(args.policies)]
        drafter_names(args.drafters, required=True)
        verify_modes(args.verify)
        categories = names(args.categories) if args.categories else None
        questions = questions_from(args.prompts, categories, args.limit)
        if args.out:
            check_writable(args.out, folder=True, name="--out")
        model, tokenizer = load(args.model, shard=args.shard)
        draft_model = resolve_draft_model(args.draft_model, model, args.model) if args.draft_model else None
        result = bench_prompts_over_ranks(  # under mlx.launch: the questions spread over the ranks
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
        if distributed.rank() != 0:  # rank 0 saves and prints the merged results
            return 0
        if args.out and result.runs:
            save_prompt_figure(result, args.out)
        print()
        print(result.table())
        from specbench.bench.prompt_runs import PROMPT_BASELINE
        from specbench.cost.bandwidth import describe_speeds
        from specbench.report import verdicts

        print(f"\nVerdict: {verdicts.bench(result.summary(), PROMPT_BASELINE)}")

        overall = {r["method"]: r["decode_tokens_per_s"] for r in result.summary() if r["category"] == "overall"}
        print(
            "\nMemory bandwidth (decode tokens/s x weight bytes per token):",
            *describe_speeds(model, overall),
            sep="\n  ",
        )
        if args.out:
            print(f"\nresults: {args.out}")

    return run


def _bench_trace(args):
    """``bench --trace``: replay traces turn by turn, plain decoding against each drafter."""
    from specbench.bench.trace_bench import run_trace
    from specbench.bench.trace_summary import format_turns
    from specbench.core.options import GenerateOptions
    from specbench.core.policies import DraftPolicy
    from specbench.inputs.importers import load_traces
    from specbench.inputs.traces import pick_ids
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
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {args.limit}")
    traces = load_traces(trace, args.trace_format)  # read and checked before the model loads
    kept = set(pick_ids([t.id for t in traces], names(args.trace_id or ""), args.limit, str(trace)))
    if args.out:
        check_writable(args.out, folder=True, name="--out")
    model, tokenizer = load(args.model, shard=args.shard)
    result = run_trace(
        model,
        tokenizer,
        [t for t in traces if t.id in kept],
        drafters=names(args.drafters),
        policies=policies,
        max_tokens=args.max_tokens,
        options=options,
        turns=args.turns,
        out=args.out,
        format=args.trace_format,
        share_store=args.share_store,
        model_name=args.model,
        truncate=args.truncate or "error",
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
