"""`specbench setup`, `specbench generate`, `specbench train-mtp` and `specbench extract-mtp`."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from specbench.cli.registry import add_model_argument, command, drafter_names
from specbench.common.files import check_writable, home, write_or_keep
from specbench.core.rules import RULES, rule_names
from specbench.drafters import drafter_choices


# -- setup -------------------------------------------------------------------------------------
@command("setup", "convert the embedded models the report uses into the cache directory (SPECBENCH_HOME)")
def _setup(parser: argparse.ArgumentParser):
    parser.add_argument("--force", action="store_true", help="rebuild even if a complete build exists")
    parser.add_argument(
        "--all",
        action="store_true",
        dest="every",
        help="also build the embedded models the report does not use (the 1.4 GB MoE twin smollm2-135m-moe), "
        "which are otherwise built on first load",
    )

    def run(args):
        import mlx.core as mx

        from specbench.common.blas import status_line
        from specbench.models.load import setup

        check_writable(home(), folder=True, name="SPECBENCH_HOME")
        for path in setup(force=args.force, every=args.every):
            print(f"ready: {path}")
        if mx.default_device().type == mx.DeviceType.cpu:
            print(status_line())

    return run


# -- generate ----------------------------------------------------------------------------------
@command("generate", "generate text from a prompt, speculatively or plainly, and print its stats")
def _generate(parser: argparse.ArgumentParser):
    add_model_argument(parser)
    parser.add_argument("--prompt", required=True, help="the user message (chat template applied unless --raw)")
    parser.add_argument("--drafter", default="lookup", help=f"one of {drafter_choices()}")
    parser.add_argument("--policy", default="auto", help="auto, fixed:K or adaptive:K")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most")
    parser.add_argument("--temp", dest="temperature", type=float, default=0.0, help="sampling temperature; 0 is greedy")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass; 1 keeps every token")
    parser.add_argument("--top-k", type=int, default=0, help="sample from the k likeliest tokens; 0: no limit")
    parser.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p x the top probability")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: none, a fresh one)")
    parser.add_argument(
        "--acceptance-rule",
        choices=rule_names(),
        default="token",
        help="how sampled drafts are accepted (greedy decoding ignores it): "
        + "; ".join(f"{name}: {kind.description}" for name, kind in RULES.items()),
    )
    parser.add_argument(
        "--sample-by-position",
        action="store_true",
        help="draw each position's token with a key of (seed, position), so that speculative sampling gives plain "
        "sampling's tokens for one seed (needs --seed)",
    )
    parser.add_argument(
        "--verify",
        choices=["exact", "fast"],
        default=None,
        help="exact: each verified row as serial decoding computes it; fast: one batched forward, on CUDA the "
        "exact split where it was timed cheaper (default: exact when greedy, fast when sampling)",
    )
    parser.add_argument(
        "--audit",
        type=float,
        default=0.0,
        metavar="RATE",
        help="share of exact verifications compared with serial steps (0-1); on a mismatch the rest runs "
        "serially and the first diverging operation is printed",
    )
    parser.add_argument("--raw", action="store_true", help="do not apply the chat template")
    parser.add_argument("--log", default=None, help="write the per-step log here (parquet)")

    def run(args):
        from specbench.core.options import GenerateOptions
        from specbench.core.policies import DraftPolicy
        from specbench.decoding import speculative_generate
        from specbench.drafters import make_drafter
        from specbench.inputs.prompts import check_text, render_prompt
        from specbench.models.load import load
        from specbench.report.render import display_text

        policy = DraftPolicy.parse(args.policy)
        drafter_names(args.drafter, "--drafter")
        check_text(args.prompt, "--prompt")
        # the options named as GenerateOptions' fields (--temp as temperature)
        options = GenerateOptions(**{f.name: getattr(args, f.name) for f in fields(GenerateOptions) if f.name in args})
        options.check()  # before the model loads
        if args.log:
            check_writable(args.log, name="--log")
        model, tokenizer = load(args.model, shard=args.shard)
        if tokenizer is None:
            raise ValueError(f"generate needs a model with a tokenizer; {args.model} has none")
        drafter = make_drafter(args.drafter, model=model, model_name=args.model)
        prompt = render_prompt(tokenizer, args.prompt, chat=not args.raw, name="--prompt")
        gen = speculative_generate(
            model, prompt, options, drafter=drafter, policy=policy if drafter else None, tokenizer=tokenizer
        )
        list(gen)  # run to the end
        print(display_text(tokenizer, gen.tokens))
        print()
        print_stats(gen.stats())
        print_step_summary(gen.log)
        if args.log:
            print(f"log: {write_or_keep(args.log, gen.log.save, 'step log')}")

    return run


def print_stats(stats: dict) -> None:
    from specbench.report.render import COUNT_STATS, RATE_STATS

    for key in [*COUNT_STATS, "pauses", *RATE_STATS, "draft_s", "verify_s"]:
        value = stats.get(key)
        print(f"  {key:22s} {value:.3f}" if isinstance(value, float) else f"  {key:22s} {value}")
    if stats.get("reasons"):  # why plain steps were taken and drafts were shorter than the policy's longest
        print(f"  {'reasons':22s} " + ", ".join(f"{code} {n}" for code, n in stats["reasons"].items()))
    if stats.get("exact_audit") is not None:  # exact verification audited, or run serially past its calibration
        print(f"  {'exact audit':22s} {stats['exact_audit'].summary()}")


def print_step_summary(log, rows: int = 12) -> None:
    """A few lines: how steps went (kind, drafted, accepted, emitted)."""
    records = log.records
    if not records:
        return
    print(f"  steps (first {min(rows, len(records))} of {len(records)}): kind k_drafted accepted emitted ms")
    for r in records[:rows]:
        ms = 1000 * (r.draft_s + r.verify_s + r.other_s)
        print(f"    {r.step:4d} {r.kind:7s} {r.k_drafted:3d} {r.accepted:3d} {r.emitted:3d} {ms:8.1f}")


# -- mtp: train-mtp, extract-mtp ----------------------------------------------------------------
@command("train-mtp", "train an MTP head for a frozen model by self-distillation (offline data)")
def _train_mtp(parser: argparse.ArgumentParser):
    add_model_argument(parser, shard=False)
    parser.add_argument(
        "--out", required=True, help="folder for mtp.safetensors (the head) and mtp.json (recipe, metrics)"
    )
    parser.add_argument("--quick", action="store_true", help="a short smoke run (tiny data, 30 steps)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the recipe's)")
    parser.add_argument(
        "--time-budget",
        dest="time_budget_s",
        type=float,
        default=None,
        help="seconds of training (the schedule follows time)",
    )
    parser.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: the recipe's)")
    parser.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the recipe's)")
    parser.add_argument(
        "--dtype",
        default=None,
        help="the frozen model's dtype: float32, bfloat16 or float16 (default: float32 on CPU, as stored elsewhere)",
    )
    parser.add_argument("--seed", type=int, default=0, help="data order and initialization seed")

    def run(args):
        from specbench.models.load import load
        from specbench.train.mtp_training import TrainConfig, summary_lines, train_mtp

        config = TrainConfig.quick() if args.quick else TrainConfig()
        for key in ("steps", "time_budget_s", "batch_size", "seq_len"):  # the recipe's, where given (each > 0)
            if (value := getattr(args, key)) is not None:
                if not value > 0:
                    raise ValueError(f"--{key.removesuffix('_s').replace('_', '-')} must be > 0, got {value}")
                setattr(config, key, value)
        config.seed = args.seed
        check_writable(args.out, folder=True, name="--out")
        model, tokenizer = load(args.model, dtype=args.dtype)
        result = train_mtp(model, tokenizer, args.out, config, model_name=args.model)
        print("\n".join(summary_lines(result)))
        print(f"head: {args.out}/{result['head']}  (attach with specbench.attach_mtp(model, path))")

    return run


@command("extract-mtp", "write only the MTP tensors of a checkpoint (folder, file or Hugging Face id) to a small file")
def _extract_mtp(parser: argparse.ArgumentParser):
    parser.add_argument(
        "src", help="checkpoint folder (sharded with model.safetensors.index.json), .safetensors file or hub id"
    )
    parser.add_argument("dst", help="output .safetensors file (or a folder: DST/mtp.safetensors)")

    def run(args):
        from specbench.models.mtp import extract_mtp

        check_writable(args.dst, folder=Path(args.dst).is_dir(), name="dst")
        path = extract_mtp(args.src, args.dst)
        print(f"wrote {path}")

    return run
