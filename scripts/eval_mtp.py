"""Acceptance of an MTP head in speculative greedy decoding, on prompts training never saw.

    python3 -m scripts.eval_mtp                                   # smollm2-135m with its shipped head
    python3 -m scripts.eval_mtp --model smollm2-135m-moe          # the MoE twin with its head
    python3 -m scripts.eval_mtp --head DIR/mtp.safetensors --prompts ../shared/data/spec-bench/question.jsonl

Prompt sets: the project's bundled chat prompts (``--prompts bundled``, the default) or a
Spec-Bench / MT-bench question.jsonl, plus snippets of held-out Python standard-library code and
docstrings continued as raw text (``--raw-sets``). Prints per set: verifications, first-draft
acceptance (the share of verifications accepting the first drafted token), mean accepted
tokens, tokens per verification and per-position acceptance; ``--out`` writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from specbench import load
from specbench.inputs.prompts import questions_from, render_prompt
from specbench.models.mtp import attach_mtp
from specbench.models.mtp.attach import shipped_head
from specbench.train.mtp_data import encode_batch, eos_id, gather_text, stream
from specbench.train.mtp_training import evaluate_decoding


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--head", default=None, help="head file (default: the model's shipped head)")
    parser.add_argument("--prompts", default="bundled", help="'bundled' or a question.jsonl")
    parser.add_argument("--limit", type=int, default=2, help="chat prompts per category (0: no chat set)")
    parser.add_argument("--raw-sets", type=int, default=6, help="held-out code and text snippets per set (0: none)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--verify", choices=["exact", "fast"], default="exact")
    parser.add_argument("--out", default=None, help="write the results here (JSON)")
    args = parser.parse_args()

    t0 = time.perf_counter()
    model, tokenizer = load(args.model)
    head = args.head or shipped_head(args.model)
    if head is None:
        raise SystemExit(f"no head: {args.model} ships none; pass --head")
    attach_mtp(model, head)
    sets = {}
    if args.limit:
        sets["chat"] = [render_prompt(tokenizer, q.turns[0]) for q in questions_from(args.prompts, limit=args.limit)]
    if args.raw_sets:
        text = gather_text(400_000)
        eos = eos_id(tokenizer)
        for kind in ("natural", "code"):
            s = stream(encode_batch(tokenizer, text[kind]["heldout"]), eos)
            step = max(1, (len(s) - 64) // args.raw_sets)
            sets[kind] = [s[a : a + 48].tolist() for a in range(0, len(s) - 64, step)][: args.raw_sets]
    results = {}
    print(f"{args.model}, head {Path(head).name}, k={args.k}, verify={args.verify}, {args.max_tokens} tokens a prompt")
    print(
        f"{'set':8s} {'prompts':>7s} {'verifies':>8s} {'first':>6s} {'mean acc':>8s} {'tok/verify':>10s}  per position"
    )
    for name, prompts in sets.items():
        r = evaluate_decoding(model, prompts, args.max_tokens, args.k, args.verify)
        results[name] = r
        pos = " ".join(f"{p:.2f}" for p in r["per_position_acceptance"])
        print(
            f"{name:8s} {r['prompts']:7d} {r['verifies']:8d} {r['first_draft_acceptance']:6.3f} "
            f"{r['mean_accepted']:8.3f} {r['tokens_per_verify']:10.3f}  {pos}"
        )
    total_v = sum(r["verifies"] for r in results.values())
    first = sum(r["first_draft_acceptance"] * r["verifies"] for r in results.values()) / max(total_v, 1)
    print(f"{'all':8s} {'':7s} {total_v:8d} {first:6.3f}   ({time.perf_counter() - t0:.0f}s)")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "model": args.model,
                    "head": str(head),
                    "k": args.k,
                    "verify": args.verify,
                    "sets": results,
                    "first_draft_acceptance": first,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
