"""Train the MTP head of the embedded model (SmolLM2-135M) on the device and measure its acceptance.

    python3 -m scripts.gpu.train_mtp              # H200: the full run, about 7 minutes (--budget 390 s to the
                                                  # end of evaluation, then the MoE twin's check)
    python3 -m scripts.gpu.train_mtp --quick      # CPU smoke run: tiny data, 30 steps

Data are made on the device: the model's own greedy answers to the project's template prompts and
its continuations of code and text snippets, plus the Python standard library's source and
docstrings and the documentation installed packages ship. Training is self-distillation (soft
cross-entropy to the frozen model's next-next-token distribution); its length follows the time
budget. Evaluation: teacher-forced first-draft acceptance on held-out natural text, code and model
generations, and speculative greedy decoding (k=3) on held-out prompts (the project's bundled chat
prompts, held-out code and text snippets); then the same decoding on the MoE twin with its head.

Writes into $OUT (default reports/gpu): smollm2-135m.safetensors (the head, bfloat16, ~8 MB),
smollm2-135m.json (recipe, training curve, metrics). Ship both in specbench/assets/mtp/.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

from scripts.gpu.budget import Budget
from specbench import load
from specbench.common.identity import write_result
from specbench.models.mtp import attach_mtp
from specbench.train.mtp_training import TrainConfig, evaluate_decoding, summary_lines, train_mtp

START = time.perf_counter()

NAME = "smollm2-135m"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run")
    parser.add_argument("--budget", type=float, default=390.0, help="seconds from start to the end of evaluation")
    parser.add_argument("--eval-reserve", type=float, default=70.0, help="seconds kept for evaluation")
    parser.add_argument("--twin-budget", type=float, default=40.0, help="seconds for the MoE twin's check (0: skip)")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT") or "reports/gpu")
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget, start=START)

    def log(text: str) -> None:
        print(f"[{budget.elapsed():6.1f}s] {text}", flush=True)

    budget.say = log

    gpu = mx.default_device().type == mx.DeviceType.gpu
    model, tokenizer = load(NAME, dtype="bfloat16" if gpu else "float32")
    log(f"model loaded on {mx.default_device()} ({'bfloat16' if gpu else 'float32'})")
    if args.quick:
        config = TrainConfig.quick()
        deadline = None
    else:
        config = TrainConfig.gpu(
            warmup_steps=150,
            text_chars=20_000_000,
            continuation_prompts=6144,
            generation_budget_s=80.0,
            eval_windows=64,
            eval_prompts=16,
            eval_tokens=96,
        )
        deadline = budget.deadline
    result = train_mtp(
        model,
        tokenizer,
        out,
        config,
        NAME,
        log=log,
        file_stem=NAME,
        deadline=deadline,
        eval_reserve_s=args.eval_reserve,
    )
    log("trained and evaluated")

    # The MoE twin with its head: same function, so the same drafts and acceptance.
    if args.twin_budget > 0:
        from dataclasses import asdict

        from mlx.utils import tree_flatten

        from specbench.inputs.prompts import bundled_questions, render_prompt
        from specbench.models.moe_twin import twin_config, twin_head_file, twin_model
        from specbench.models.synthetic import ready

        head_file = out / f"{NAME}.safetensors"
        # the twin built in memory (the dense weights shared until copied)
        twin = ready(twin_model(twin_config(asdict(model.args)), dict(tree_flatten(model.parameters())), 0))
        with tempfile.TemporaryDirectory() as tmp:
            attach_mtp(twin, twin_head_file(head_file, Path(tmp) / "twin.safetensors"))
        attach_mtp(model, head_file)
        prompts = [render_prompt(tokenizer, q.turns[0]) for q in bundled_questions()[::4]]
        twin_tokens = 64
        if args.quick:
            prompts, twin_tokens = prompts[:1], 12
        twin_budget = Budget(args.twin_budget, say=log)
        rows = {}
        for name, m in (("dense", model), ("moe-twin", twin)):
            if twin_budget.over(f"MoE twin check: {name}"):
                break
            rows[name] = evaluate_decoding(m, prompts, twin_tokens, config.eval_k, "fast")
            log(f"{name}: first-draft acceptance {rows[name]['first_draft_acceptance']:.3f}")
        result["moe_twin"] = rows
        path = out / f"{NAME}.json"
        write_result(path, result)

    print()
    print("\n".join(summary_lines(result)))
    for name, m in result.get("moe_twin", {}).items():
        print(
            f"{'decode chat (' + name + ')':24s} {m['first_draft_acceptance']:8.3f} {m['mean_accepted']:8.3f} "
            f"{m['tokens_per_verify']:12.3f}"
        )
    print(f"total {budget.elapsed():.0f}s; files in {out}: {NAME}.safetensors, {NAME}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
