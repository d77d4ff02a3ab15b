"""Retrain the MTP head of the embedded model (SmolLM2-135M), distil a small draft model for it, and
measure both, with the shipped head and early exit, on a held-out split of three kinds.

    python3 -m scripts.gpu.drafters                   # H200, about 7 minutes (--budget 420 s in all)
    python3 -m scripts.gpu.drafters --evaluate-only   # H200, about 4 minutes (--budget 360 s): what ships, no training
    python3 -m scripts.gpu.drafters --quick           # CPU smoke run: tiny data, 2 steps each, every phase run

Phases, each within --budget, every file written as soon as it exists:
1. data: the model's own greedy answers to chat prompts the project writes and its continuations of code and
   text, plus standard-library code and package documents (``specbench.train.mtp_data``; Spec-Bench is never
   read for training);
2. the MTP head (every draft position, fed its own chained states), scored against the shipped head on the
   held-out split; written only when it wins (``scripts.gpu.drafter_training.head_phase``);
3. a draft model: --draft-layers layers of SmolLM2's width with a --draft-mlp channel MLP, distilled on the
   same windows; the file holds its own layers only (bfloat16, under 8 MB) (``draft_phase``);
4. evaluation (``scripts.gpu.drafter_eval``): greedy speculative decoding (k = 3, fast verify) on the
   held-out split (``scripts.gpu.draft_training.heldout_split``: Spec-Bench chat and summarization,
   held-out standard-library code), the draft model against mlx-lm's speculative_generate_step, plain
   decoding, and an early-exit sweep.

--evaluate-only trains nothing: it evaluates what ships (specbench/assets/mtp, specbench/assets/draft) as
phase 4 does, against mlx-lm on every bundled prompt category (two prompts each) and the three kinds.

Spec-Bench's question.jsonl is read from --data (default ../shared/data next to the repository) and
never copied. Writes into $OUT (default reports/gpu): draft-smollm2-135m.safetensors (the draft),
mtp-smollm2-135m.safetensors (only when the new head wins), drafters.json (recipes, training
curves, split, metrics, decision, file sizes) and drafters.md (the tables). The last lines print
the copy commands that ship the files.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import mlx.core as mx

from scripts.gpu.budget import Budget
from scripts.gpu.draft_training import HELDOUT_KINDS, heldout_split
from scripts.gpu.drafter_eval import TARGETS, compare_and_sweep, evaluate, report
from scripts.gpu.drafter_training import draft_phase, head_phase, parameter_count
from specbench import load
from specbench.common.files import write_text_atomic
from specbench.common.identity import write_result
from specbench.core.forward import text_model
from specbench.drafters import MtpHead, make_drafter, shipped_draft_model
from specbench.models.embedded import shipped_draft_path
from specbench.models.mtp.attach import load_head, shipped_head
from specbench.train.mtp_data import WindowSampler
from specbench.train.mtp_training import TrainConfig, build_data

START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[2]

NAME = "smollm2-135m"
#: Seconds the evaluation after each training phase needs on the H200 (measured phases of an earlier run).
HEAD_EVAL_S, DRAFT_EVAL_S = 35.0, 135.0
#: Seconds each evaluation phase needs on the H200 (the earlier run's phases, rounded up), checked against the budget.
NEEDS_S = {"plain": 12.0, "versus mlx-lm": 30.0, "early exit": 15.0, "early-exit eval": 25.0, "drafter eval": 25.0}
#: Every key of the settings ``configs`` returns, in quick and full runs alike.
SETTING_KEYS = {
    "per_kind", "tokens", "prompt_tokens", "exits", "sweep_per_kind", "sweep_prompts", "sweep_tokens",
    "categories", "per_category", "versus_kinds", "head_eval_s", "draft_eval_s",
}  # fmt: skip


def log(text: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {text}", flush=True)


def configs(quick: bool, evaluate_only: bool = False) -> tuple[TrainConfig, dict]:
    """The training configuration and the evaluation settings (``SETTING_KEYS``) of a run."""
    config, settings = _configs(quick)
    if evaluate_only:  # every bundled category (two prompts each on the GPU) and every kind against mlx-lm
        settings.update(categories=8, per_category=1 if quick else 2, versus_kinds=len(HELDOUT_KINDS))
        if quick:  # this CPU's reference BLAS makes a prompt pass cost ~0.13 s a token: short prompts
            settings.update(exits=[8, 27], prompt_tokens=6)
    if settings.keys() != SETTING_KEYS:
        raise KeyError(f"settings keys differ from SETTING_KEYS: {sorted(settings.keys() ^ SETTING_KEYS)}")
    return config, settings


def _configs(quick: bool) -> tuple[TrainConfig, dict]:
    if quick:  # a smoke run: this CPU's matmuls run at a few GFLOP/s, so every shape is minimal
        config = TrainConfig.quick()
        config.steps, config.batch_size, config.seq_len, config.warmup_steps = 1, 1, 8, 1
        config.chat_prompts, config.continuation_prompts, config.continuation_prompt_tokens = 1, 2, 8
        config.chat_tokens = config.continuation_tokens = 3
        config.text_chars, config.eval_windows, config.generation_batch = 30_000, 0, 2
        settings = {"per_kind": 1, "tokens": 3, "prompt_tokens": 12, "exits": [28], "sweep_per_kind": 1}
        settings |= {"sweep_prompts": 1, "sweep_tokens": 3, "categories": 1, "per_category": 1, "versus_kinds": 1}
        return config, {**settings, "head_eval_s": 0.0, "draft_eval_s": 0.0}
    config = TrainConfig.gpu(
        warmup_steps=100,
        text_chars=12_000_000,
        continuation_prompts=4096,
        generation_budget_s=75.0,
        chat_share=0.75,
        mix={"chat": 0.4, "continued": 0.2, "code": 0.2, "natural": 0.2},
        depth_decay=0.9,
        eval_windows=0,
    )
    settings = {"per_kind": 8, "tokens": 64, "prompt_tokens": 64, "exits": [8, 15, 22, 27], "sweep_per_kind": 2}
    settings |= {"sweep_prompts": 2 * len(HELDOUT_KINDS), "sweep_tokens": 32, "categories": 8, "per_category": 1}
    return config, {
        **settings,
        "versus_kinds": len(HELDOUT_KINDS),
        "head_eval_s": HEAD_EVAL_S,
        "draft_eval_s": DRAFT_EVAL_S,
    }


def warm_up(model) -> None:
    """Build the kernels of the training shapes once, untimed in the training budget."""
    mx.eval(model(mx.zeros((1, 8), dtype=mx.uint32)))
    log("warmed up")


def save(results: dict, budget: Budget, path: Path) -> None:
    """Write the results so far, with what the budget left out."""
    results["skipped"] = budget.skipped_names()
    write_result(path, results)


def train_and_evaluate(
    args, model, tokenizer, split, config, settings, results, budget: Budget, out
) -> dict[str, Path]:
    """Phases 1-5: the data, the new head against the shipped one, the draft model, then the shared
    evaluation (``compare_and_sweep``); returns the files written to ship."""
    streams, _, results["data"] = build_data(model, tokenizer, config, log)
    sampler = WindowSampler(streams, config.mix, config.seq_len, config.seed)
    train_s = budget.left() - settings["head_eval_s"] - settings["draft_eval_s"]
    config.time_budget_s = None if args.quick else max(10.0, args.head_share * train_s)
    log(f"head training budget {config.time_budget_s or 0:.0f}s (training time left {train_s:.0f}s)")
    shipped = load_head(model, shipped_head(NAME))
    head, files = head_phase(model, sampler, split, config, shipped, settings["tokens"], results, out, NAME, log)
    results["parameters"] = {"mtp_head": parameter_count(head)}
    config.time_budget_s = None if args.quick else max(10.0, budget.left() - settings["draft_eval_s"])
    config.learning_rate, config.warmup_steps = 3e-4, min(config.warmup_steps, 50)
    log(f"draft training budget {config.time_budget_s or 0:.0f}s")
    layers, mlp, tokens = args.draft_layers, args.draft_mlp, settings["tokens"]
    draft, files["draft"] = draft_phase(model, sampler, split, config, layers, mlp, tokens, results, out, NAME, log)
    results["files"] = {p.name: p.stat().st_size for p in files.values()}
    log(f"files: {results['files']}")
    compare_and_sweep(model, tokenizer, split, settings, results, budget, draft, NEEDS_S, args.quick, log)
    save(results, budget, out / "drafters.json")
    return files


def evaluate_shipped(model, tokenizer, split, settings, results, budget: Budget, json_path, quick) -> None:
    """--evaluate-only: no training; what ships (the draft model as ``make_drafter("draft-model")``
    loads it, the MTP head as ``shipped_head`` names it), through ``compare_and_sweep``, then each on
    the whole split."""
    draft = shipped_draft_model(model, NAME)
    head_path = shipped_head(NAME)
    results["shipped"] = {
        "draft_model": {
            "layers": len(text_model(draft).model.layers),
            "bytes": shipped_draft_path(NAME).stat().st_size,
        },
        "mtp_head": {"path": str(head_path), "bytes": head_path.stat().st_size},
    }
    compare_and_sweep(model, tokenizer, split, settings, results, budget, draft, NEEDS_S, quick, log)
    save(results, budget, json_path)
    if budget.fits("draft-model", NEEDS_S["drafter eval"]):
        results["evaluation"]["draft-model"] = evaluate(
            "draft-model",
            model,
            split,
            settings["tokens"],
            lambda: make_drafter("draft-model", model, NAME, draft_model=draft),
            log,
        )
        save(results, budget, json_path)
    if budget.fits("mtp (shipped)", NEEDS_S["drafter eval"]):
        head = load_head(model, head_path)
        results["evaluation"]["mtp (shipped)"] = evaluate(
            "mtp (shipped)", model, split, settings["tokens"], lambda: MtpHead(model, head=head), log
        )


def finish(results: dict, files: dict[str, Path], out: Path, budget: Budget) -> None:
    """Write drafters.json and drafters.md, print the tables and the copy commands that ship the files."""
    results["seconds_total"] = round(budget.elapsed(), 1)
    save(results, budget, out / "drafters.json")
    text = report(results)
    write_text_atomic(out / "drafters.md", text + "\n")
    print()
    print(text)
    if files:
        sizes = ", ".join(f"{k} ({v / 1e6:.2f} MB)" for k, v in results["files"].items())
        print(f"\nfiles in {out}: {sizes}")
        print("to ship:")
        print(f"  cp {files['draft']} specbench/assets/draft/{NAME}.safetensors")
    if "mtp" in files:
        print(f"  cp {files['mtp']} specbench/assets/mtp/{NAME}.safetensors")
        print(f"  cp {files['mtp_record']} specbench/assets/mtp/{NAME}.json")
    print(f"total {results['seconds_total']:.0f}s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--quick", action="store_true", help="CPU smoke run")
    evaluate_help = "train nothing: evaluate the shipped MTP head and draft model, plain decoding, mlx-lm, early exit"
    add("--evaluate-only", action="store_true", help=evaluate_help)
    add("--budget", type=float, default=None, help="seconds in all, evaluation included (420; 360 --evaluate-only)")
    add("--draft-layers", type=int, default=2, help="decoder layers of the draft model")
    add("--draft-mlp", type=int, default=512, help="MLP channels of the draft's layers")
    add("--head-share", type=float, default=0.7, help="share of the training time for the head")
    add("--data", default=str(ROOT.parent / "shared" / "data"), help="folder holding spec-bench/")
    add("--out", default=None, help="output folder (default $OUT, else reports/gpu)")
    fallback_help = "without Spec-Bench's question.jsonl, judge on the bundled prompts and held-out package documents"
    add("--allow-fallback", action="store_true", help=fallback_help)
    args = parser.parse_args()
    questions = Path(args.data) / "spec-bench" / "question.jsonl"
    if not questions.is_file() and not args.allow_fallback:
        parser.error(
            f"no Spec-Bench questions at {questions}: the held-out split's chat and natural kinds come from it. "
            "Pass --data FOLDER (holding spec-bench/question.jsonl; on a GPU machine carry a copy in an ignored "
            "folder, e.g. .gpu/data), or --allow-fallback to judge on the bundled prompts instead"
        )
    out = Path(args.out or os.environ.get("OUT") or "reports/gpu")
    out.mkdir(parents=True, exist_ok=True)
    args.budget = args.budget or (360.0 if args.evaluate_only else 420.0)
    budget = Budget(args.budget, start=START, say=log)
    gpu = mx.default_device().type == mx.DeviceType.gpu
    model, tokenizer = load(NAME, dtype="bfloat16" if gpu else "float32")
    dtype = text_model(model).model.norm.weight.dtype
    log(f"model loaded on {mx.default_device()} ({dtype})")
    config, settings = configs(args.quick, args.evaluate_only)
    warm_up(model)
    split = heldout_split(tokenizer, args.data, settings["per_kind"], settings["prompt_tokens"])
    if args.quick:  # smoke runs only: the last tokens of each chat prompt (the template's end)
        split["prompts"]["chat"] = [p[-settings["prompt_tokens"] :] for p in split["prompts"]["chat"]]
    results: dict = {
        "model": NAME,
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
        "mode": "evaluate-only" if args.evaluate_only else "train and evaluate",
        "budget_s": args.budget,
        "split": {"sources": split["sources"], "mean_prompt_tokens": split["mean_prompt_tokens"]},
        "targets": {"per_position_acceptance": TARGETS},
        "evaluation": {},
        "skipped": [],
    }
    json_path = out / "drafters.json"
    if args.evaluate_only:
        evaluate_shipped(model, tokenizer, split, settings, results, budget, json_path, args.quick)
        files: dict[str, Path] = {}
    else:
        files = train_and_evaluate(args, model, tokenizer, split, config, settings, results, budget, out)
    finish(results, files, out, budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
