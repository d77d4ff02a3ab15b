"""`specbench simulate`: model-free drafters replayed over recorded outputs, without running a model."""

from __future__ import annotations

import argparse

from specbench.cli.registry import command, integers, names, reasoning_argument
from specbench.common.files import check_writable


@command(
    "simulate",
    "replay model-free drafters over recorded outputs (a log's assistant messages, or a model's greedy outputs): "
    "accepted tokens per verification per drafter, k and store scope",
)
def _simulate(parser: argparse.ArgumentParser):
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--trace",
        help="a conversation log (any format bench trace reads) or a folder of them: its recorded assistant "
        "messages, tokenized with --tokenizer",
    )
    source.add_argument(
        "--recorded",
        help="a model's recorded greedy outputs (parquet with prompt, output, finish_reason: bench trace's "
        "*.plain.parquet) or a folder of them",
    )
    from specbench.simulate.simulate import model_free_drafters

    free = ", ".join(model_free_drafters())
    parser.add_argument("--drafters", default="lookup,suffix", help=f"comma list of model-free drafters: {free}")
    parser.add_argument("--k", default="2,4,8,16", help="comma list of draft lengths (a fixed:k policy each)")
    parser.add_argument(
        "--store",
        default="shared,per-trace",
        help="comma list of store scopes: shared (one drafter over all traces in turn), per-trace (fresh per trace)",
    )
    parser.add_argument(
        "--tokenizer", default="smollm2-135m", help="--trace: the tokenizer of an embedded model or a local folder"
    )
    parser.add_argument("--trace-format", default=None, help="--trace: the log's format (default: detected)")
    reasoning_argument(parser)
    parser.add_argument("--trace-id", default=None, help="comma list of trace ids to replay (default: all)")
    parser.add_argument("--limit", type=int, default=None, help="replay at most N traces (in file order)")
    parser.add_argument("--out", default=None, help="folder for the summary (parquet, text) and the step log")
    parser.add_argument(
        "--policies",
        default=None,
        help="comma list of draft-length policies to replay and rank by predicted speedup instead of fixed k "
        "(auto, fixed:N, vllm[:B=K,...], sglang[:T,...], ollama[:MAX_K], confidence[:P[:MAX_K]]); needs --profile",
    )
    parser.add_argument(
        "--profile", default=None, help="--policies: a stored cost profile (JSON) pricing the steps each policy took"
    )

    def run(args):
        from specbench.simulate.simulate_logs import save_simulation, simulate_logs

        drafters, ks, stores = names(args.drafters), integers(args.k, "--k"), names(args.store)
        if args.out:
            check_writable(args.out, folder=True, name="--out")
        if args.policies:
            return _rank(args, drafters, ks)
        result = simulate_logs(args.trace or args.recorded, drafters, ks, stores, args.tokenizer, **_reading(args))
        print(
            f"{result.traces} traces, {result.turns} turns, {result.prompt_tokens} prompt tokens; "
            f"{result.skipped} turns without a recorded reply skipped; {result.seconds:.1f} s"
        )
        print(result.table())
        if args.out:
            save_simulation(result, args.out)
            print(f"\nresults: {args.out}")

    return run


def _rank(args: argparse.Namespace, drafters: list[str], ks: list[int]) -> None:
    """``--policies``: each policy replayed on the recorded outputs, ranked by predicted speedup."""
    from pathlib import Path

    from specbench.common.files import write_parquet_atomic, write_text_atomic
    from specbench.cost.profile import read_profile
    from specbench.simulate.policies import format_ranking, rank_policies
    from specbench.simulate.simulate_logs import load_groups

    if not args.profile:
        raise ValueError("--policies needs --profile: a stored cost profile (JSON) to price the steps with")
    if len(drafters) != 1 or len(ks) != 1:
        raise ValueError("--policies replays one drafter with one longest draft: give one --drafters and one --k")
    profile = read_profile(args.profile)
    source = args.trace or args.recorded
    groups, skipped = load_groups(source, args.tokenizer, **_reading(args))
    workload = Path(source).stem.removesuffix(".plain")
    table, steps = rank_policies({workload: groups}, names(args.policies), profile, drafters[0], ks[0])
    print(f"{len(groups)} traces; {skipped} turns without a recorded reply skipped; priced by {profile.name}")
    print(format_ranking(table))
    if args.out:
        out = Path(args.out)
        write_parquet_atomic(table, out / "policies.parquet")
        steps.save(out / "policies_steps.parquet")
        write_text_atomic(out / "policies.txt", format_ranking(table) + "\n")
        print(f"\nresults: {args.out}")


def _reading(args: argparse.Namespace) -> dict:
    """How the logs or recorded outputs are read: the options ``simulate_logs`` and ``load_groups`` share."""
    return dict(
        recorded=args.recorded is not None,
        format=args.trace_format,
        trace_ids=names(args.trace_id) if args.trace_id else None,
        limit=args.limit,
        reasoning=args.reasoning,
    )
