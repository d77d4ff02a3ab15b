"""`specbench bench`: prompt sets and conversation traces against mlx-lm."""

from __future__ import annotations

import argparse
from pathlib import Path

from specbench.cli.registry import (
    add_model_argument,
    command,
    device_defaults,
    drafter_names,
    draw_figure,
    names,
    prompt_selection,
    reasoning_argument,
    verify_modes,
)
from specbench.common.files import check_writable
from specbench.drafters import drafter_choices

# -- bench ---------------------------------------------------------------------------------------------------------
MODES = ("prompts", "trace", "batch")


def _common(parser: argparse.ArgumentParser, shard: bool = True) -> None:
    """The options every mode takes: the model, drafters, policies, tokens, output folder and verify mode."""
    add_model_argument(parser, shard=shard)
    parser.add_argument("--drafters", "--drafter", default="lookup,suffix", help=f"comma list of {drafter_choices()}")
    parser.add_argument("--policies", "--policy", default="auto,fixed:4", help="comma list: auto, fixed:K, adaptive:K")
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="tokens per prompt or turn (default: 128; 32 on a CPU)"
    )
    parser.add_argument("--out", default=None, help="folder for the results (parquet, table, figure)")


def _trace_selection(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace-format",
        default=None,
        help="trace, openai, runs, sharegpt, tau-bench, swe-agent or questions (default: detected)",
    )
    parser.add_argument("--trace-id", default=None, help="comma list of the trace ids to replay (default: all)")
    parser.add_argument("--turns", type=int, default=None, help="replay only the first N turns of each trace")
    reasoning_argument(parser)


def _configure_prompts(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "prompts",
        nargs="?",
        default="bundled",
        help="a Spec-Bench/MT-bench question.jsonl, or 'bundled' for the project's prompts",
    )
    _common(parser)
    prompt_selection(parser)
    parser.add_argument("--repeats", type=int, default=1, help="timed runs of every method per prompt")
    parser.add_argument(
        "--draft-model",
        default=None,
        help="a draft model (a name, a folder, a draft .safetensors, or 'shipped'): specbench's draft-model and "
        "mlx-lm's speculation with it",
    )
    parser.add_argument("--k", type=int, default=2, help="the draft length of mlx-lm's speculation with --draft-model")
    parser.add_argument("--verify", default=None, help="comma list of exact, fast (default: the engine's)")
    parser.add_argument("--fresh", action="store_true", help="start over instead of resuming in --out")
    parser.add_argument(
        "--profile-first",
        action="store_true",
        help="measure and store the model's cost profile first when none is stored for the verify modes in use "
        "(as `specbench profile` does; minutes on a CPU), so that each speculative method gets a prediction",
    )


def _configure_trace(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="a trace file to replay turn by turn")
    _common(parser)
    parser.add_argument("--limit", type=int, default=None, help="at most N traces (default: all; 3 on a CPU)")
    _trace_selection(parser)
    parser.add_argument("--verify", default=None, help="exact or fast (default: the engine's)")
    parser.add_argument(
        "--truncate",
        choices=("oldest",),
        default=None,
        help="drop a turn's oldest messages to fit the model's context (default: an error naming the turn)",
    )
    parser.add_argument(
        "--share-store", action="store_true", help="keep each drafter (SuffixDecoding's store) across the traces"
    )


def _configure_batch(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--prompts", help="a Spec-Bench/MT-bench question.jsonl, or 'bundled' for the project's prompts"
    )
    source.add_argument("--trace", help="a trace file: every turn of its traces is a request")
    parser.add_argument("--batch-size", type=int, required=True, help="B: requests decoded together")
    _common(parser, shard=False)
    prompt_selection(parser, traces=True)
    _trace_selection(parser)
    parser.add_argument(
        "--verify",
        default=None,
        choices=("fast", "exact"),
        help="fast (default; one forward over the [B, w] block) or exact (every request's output equals its own "
        "single-request greedy output)",
    )


CONFIGURE = {"prompts": _configure_prompts, "trace": _configure_trace, "batch": _configure_batch}
HELP = {
    "prompts": "a prompt set (Spec-Bench/MT-bench questions) against mlx-lm, batch 1",
    "trace": "conversation traces replayed turn by turn, plain decoding against each drafter",
    "batch": "B requests at a time (prompts, or every turn of traces) against plain batched decoding and mlx-lm "
    "batch_generate",
}


@command("bench", "benchmark drafters and policies against mlx-lm: bench prompts | trace | batch")
def _bench(parser: argparse.ArgumentParser):
    modes = parser.add_subparsers(dest="mode", required=True, metavar="{prompts,trace,batch}")
    for mode in MODES:
        CONFIGURE[mode](
            modes.add_parser(mode, help=HELP[mode], description=HELP[mode], formatter_class=parser.formatter_class)
        )

    def run(args: argparse.Namespace) -> int:
        from specbench.core.policies import DraftPolicy
        from specbench.report.progress import Heartbeat

        device_defaults(args)  # on a CPU: a run of minutes unless asked for more
        for name in ("limit", "turns"):
            if (value := getattr(args, name, None)) is not None and value < 1:
                raise ValueError(f"--{name} must be >= 1, got {value}")
        policies = [DraftPolicy.parse(p) for p in names(args.policies)]
        drafter_names(args.drafters, required=True)
        if args.out:
            check_writable(args.out, folder=True, name="--out")
        with Heartbeat("specbench bench"):  # a line every 30 s, so that no stretch of the run is silent
            return {"prompts": _bench_prompts, "trace": _bench_trace, "batch": _bench_batch}[args.mode](args, policies)

    return run


def _traces(args: argparse.Namespace) -> list:
    """The traces of --trace that --trace-id and --limit pick, read and checked before the model loads."""
    from specbench.inputs.importers import load_traces
    from specbench.inputs.traces import pick_ids

    path = Path(args.trace)
    if path.is_dir():
        raise FileNotFoundError(f"no trace file at {path} (it is a folder)")
    traces = load_traces(path, args.trace_format, args.reasoning)  # a bare name: a bundled trace
    kept = set(pick_ids([t.id for t in traces], names(args.trace_id or ""), args.limit, str(path)))
    return [t for t in traces if t.id in kept]


def _bench_batch(args: argparse.Namespace, policies: list) -> int:
    """``bench batch``: B requests at a time (each question's first turn, or every turn of the traces), each drafter
    and policy against plain batched decoding and mlx-lm; with --out, batch_bench.csv (a row per engine) and
    batch_divergence.csv (a row per request) there."""
    from dataclasses import asdict

    from specbench.bench.batch_bench import bench_batch, format_batch_bench, trace_requests
    from specbench.common.files import write_csv_atomic
    from specbench.core.forward import context_length
    from specbench.inputs.prompts import questions_from, render_prompt
    from specbench.models.load import load

    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be an integer >= 1, got {args.batch_size!r}")
    if args.trace is not None:
        traces = _traces(args)
    else:
        questions = questions_from(args.prompts, names(args.categories) if args.categories else None, args.limit)
    model, tokenizer = load(args.model)
    if args.trace is not None:
        context = context_length(model)
        requests, labels, too_long = trace_requests(tokenizer, traces, args.turns, context, args.max_tokens)
        if too_long:
            print(f"{too_long} turns left out: prompt + {args.max_tokens} tokens exceed the model's context")
        if not requests:
            raise ValueError(f"no turn of {args.trace} fits the model's context with --max-tokens {args.max_tokens}")
    else:
        requests = [render_prompt(tokenizer, q.turns[0]) for q in questions]
        labels = [f"{q.category}/{q.question_id}" for q in questions]
    source = str(args.trace or args.prompts)
    print(f"{len(requests)} requests from {source}, batch size {args.batch_size}", flush=True)
    drafters = names(args.drafters)
    result = bench_batch(
        model, requests, args.batch_size, drafters, policies, args.max_tokens, tokenizer, verify=args.verify or "fast"
    )
    print(format_batch_bench(result))
    if args.out:
        rows = [{"model": args.model, "source": source, **asdict(r)} for r in result.rows]
        write_csv_atomic(Path(args.out) / "batch_bench.csv", rows)
        divergence = [{"model": args.model, **asdict(r), "label": labels[r.request]} for r in result.divergence]
        write_csv_atomic(Path(args.out) / "batch_divergence.csv", divergence)
        print(f"\nresults: {args.out}")
    return 0


def _bench_prompts(args: argparse.Namespace, policies: list) -> int:
    """``bench prompts``: every method on a prompt set, batch 1, against mlx-lm."""
    from specbench.bench.prompt_bench import bench_prompts
    from specbench.bench.prompt_runs import PROMPT_BASELINE
    from specbench.common import distributed
    from specbench.cost.bandwidth import describe_speeds
    from specbench.drafters.draft_model import resolve_draft_model
    from specbench.inputs.prompts import questions_from
    from specbench.models.load import load
    from specbench.report import verdicts

    verify_modes(args.verify)
    questions = questions_from(args.prompts, names(args.categories) if args.categories else None, args.limit)
    model, tokenizer = load(args.model, shard=args.shard)
    draft_model = resolve_draft_model(args.draft_model, model, args.model) if args.draft_model else None
    if args.profile_first:  # on every rank: each its own device's profile (a sharded model's ranks together)
        _profile_first(model, args.model, names(args.verify) if args.verify else [], policies)
    result = bench_prompts(
        model,
        tokenizer,
        questions,
        drafters=names(args.drafters),
        policies=policies,
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        draft_model=draft_model,
        k=args.k,
        verify=names(args.verify) if args.verify else (None,),
        model_name=args.model,
        out=args.out,
        fresh=args.fresh,
        spread=True,  # under mlx.launch: the questions spread over the ranks
    )
    if distributed.rank() != 0:  # rank 0 saves and prints the merged results
        return 0
    if args.out and result.runs:
        draw_figure("bench", "save_prompt_figure", result, args.out)
    print()
    print(result.table())
    summary = result.summary()
    print(f"\nVerdict: {verdicts.bench(summary, PROMPT_BASELINE)}")
    overall = {r["method"]: r["decode_tokens_per_s"] for r in summary if r["category"] == "overall"}
    print(
        "\nMemory bandwidth (decode tokens/s x weight bytes per token):",
        *describe_speeds(model, overall),
        sep="\n  ",
    )
    if args.out:
        print(f"\nresults: {args.out}")
    return 0


def _profile_first(model, name: str, modes: list[str], policies: list) -> None:
    """``--profile-first``: measure and store ``model``'s cost profile in ``modes`` (default: greedy's) at widths
    up to the longest draft the policies ask for plus one (at least 9), unless one is stored with those modes."""
    from specbench.core.options import GenerateOptions
    from specbench.cost import load_profile, measure, save_profile

    modes = modes or [GenerateOptions().verify_mode]
    stored = load_profile(model)
    if stored is not None and set(modes) <= set(stored.costs):
        return
    widths = max([9] + [p.longest_draft(None) + 1 for p in policies])
    print(f"--profile-first: measuring the {', '.join(modes)} verify costs of {name} at widths 1..{widths}")
    profile = measure(model, widths=widths, verify=modes, progress=lambda text: print(f"  {text}"))
    print(f"profile: {save_profile(profile)}")


def _bench_trace(args: argparse.Namespace, policies: list) -> int:
    """``bench trace``: replay traces turn by turn, plain decoding against each drafter."""
    from specbench.bench.trace_bench import run_trace
    from specbench.bench.trace_summary import format_turns
    from specbench.core.options import GenerateOptions
    from specbench.models.load import load

    verify = verify_modes(args.verify)
    if len(verify) > 1:
        raise ValueError("bench trace takes one --verify mode (exact or fast)")
    options = GenerateOptions(max_tokens=args.max_tokens, verify=verify[0] if verify else None)
    traces = _traces(args)
    model, tokenizer = load(args.model, shard=args.shard)
    result = run_trace(
        model,
        tokenizer,
        traces,
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
