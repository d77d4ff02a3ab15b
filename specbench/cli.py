"""`specbench` command line: each subcommand parses, calls the library, prints."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

COMMANDS: dict[str, Callable[[argparse.Namespace], int | None]] = {}


def command(name: str, help: str):
    """Register ``fn(args)`` as subcommand ``name``; ``fn.configure(parser)`` adds its arguments."""

    def wrap(configure: Callable[[argparse.ArgumentParser], Callable]):
        COMMANDS[name] = (help, configure)
        return configure

    return wrap


# -- setup -------------------------------------------------------------------------------------
@command("setup", "convert the embedded models into the cache directory (SPECBENCH_HOME)")
def _setup(parser: argparse.ArgumentParser):
    def run(args):
        from .models import setup

        for path in setup():
            print(f"ready: {path}")

    return run


# -- generate ----------------------------------------------------------------------------------
@command("generate", "generate text from a prompt, speculatively or plainly, and print its stats")
def _generate(parser: argparse.ArgumentParser):
    parser.add_argument("--model", default="smollm2-135m", help="short name, local folder or mlx-lm id")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--drafter", default="lookup", help="lookup, suffix, mtp or none")
    parser.add_argument("--policy", default="auto", help="auto, fixed:N or adaptive:N")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--verify", choices=["exact", "fast"], default=None)
    parser.add_argument("--raw", action="store_true", help="do not apply the chat template")
    parser.add_argument("--log", default=None, help="write the per-step log here (parquet)")

    def run(args):
        from . import GenerateOptions, load, speculative_generate
        from .drafters import make_drafter
        from .policies import DraftPolicy
        from .prompts import render_prompt

        policy = DraftPolicy.parse(args.policy)
        model, tokenizer = load(args.model)
        drafter = make_drafter(args.drafter, model=model, model_name=args.model)
        prompt = render_prompt(tokenizer, args.prompt, chat=not args.raw)
        options = GenerateOptions(
            max_tokens=args.max_tokens, temperature=args.temp, top_p=args.top_p, top_k=args.top_k,
            min_p=args.min_p, seed=args.seed, verify=args.verify,
        )
        gen = speculative_generate(model, prompt, options, drafter, policy if drafter else None, tokenizer=tokenizer)
        for _ in gen:
            pass
        print(gen.text())
        print()
        print_stats(gen.stats())
        print_step_summary(gen.log)
        if args.log:
            print(f"log: {gen.log.save(args.log)}")

    return run


def print_stats(stats: dict) -> None:
    keys = [
        "tokens", "finish_reason", "steps", "verifies", "drafted", "accepted", "pauses",
        "acceptance_rate", "mean_accepted_tokens", "tokens_per_verify", "decode_tokens_per_s",
        "prefill_s", "draft_s", "verify_s",
    ]
    for key in keys:
        value = stats.get(key)
        print(f"  {key:22s} {value:.3f}" if isinstance(value, float) else f"  {key:22s} {value}")


def print_step_summary(log, rows: int = 12) -> None:
    """A few lines: how steps went (kind, drafted, accepted, emitted)."""
    records = log.records
    if not records:
        return
    print(f"  steps (first {min(rows, len(records))} of {len(records)}): kind k_drafted accepted emitted ms")
    for r in records[:rows]:
        ms = 1000 * (r["draft_s"] + r["verify_s"] + r["other_s"])
        print(f"    {r['step']:4d} {r['kind']:7s} {r['k_drafted']:3d} {r['accepted']:3d} {r['emitted']:3d} {ms:8.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    runners = {}
    for name, (help_text, configure) in COMMANDS.items():
        runners[name] = configure(sub.add_parser(name, help=help_text, description=help_text))
    args = parser.parse_args(argv)
    try:
        return int(runners[args.command](args) or 0)
    except (ValueError, FileNotFoundError) as err:
        print(f"specbench {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
