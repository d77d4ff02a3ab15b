"""`specbench train-mtp` and `specbench extract-mtp`."""

from __future__ import annotations

import argparse
from pathlib import Path

from specbench.cli.registry import add_model_argument, command
from specbench.common.files import check_writable


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
