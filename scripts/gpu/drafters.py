"""Train a draft model and a multi-position MTP head for the embedded model (SmolLM2-135M) and measure
both, with the shipped head and early exit, on a held-out split of three kinds.

    python3 scripts/gpu/drafters.py            # H200, about 7 minutes (--budget 420 s in all)
    python3 scripts/gpu/drafters.py --quick    # CPU smoke run: tiny data, 2 steps each, every phase run

Phases (each bounded by the budget; files are written as soon as they exist):
1. data: the model's own greedy answers to the project's template prompts and continuations of
   code and text snippets, plus standard-library code and docstrings and package documents
   (``specbench.experiments.mtp_data``; Spec-Bench is never read for training);
2. the MTP head, every draft position trained (the head fed its own chained states, positions
   1..3; ``chain_loss``), initialised from the last body layer;
3. a draft model: ``--draft-layers`` decoder layers of SmolLM2's own width, initialised as copies
   of layers spread over the depth, distilled on the same windows (soft cross-entropy to the
   target's next-token distribution at every position); embeddings and output head are the
   target's, frozen and not stored;
4. evaluation (phases in this order, each skipped when the budget cannot hold it): greedy
   speculative decoding (fixed k = 3, fast verification) on the held-out split
   (``specbench.experiments.draft_training.heldout_split``: Spec-Bench chat first turns with the chat
   template, Spec-Bench summarization articles as plain text, held-out standard-library code; the
   rule is fixed in that module) for the new head and the draft model; the draft model through
   specbench and through mlx-lm's speculative_generate_step (same pair, k = 3): tokens/s ratio and
   acceptance per kind; plain decoding of the same prompts (for each drafter's speed ratio); the
   shipped head; early exit at a few depths. Acceptance per draft position (cumulative and
   conditional) and per kind.

Spec-Bench's question.jsonl is read from --data (default ../shared/data next to the repository) and
never copied. Writes into $OUT (default reports/gpu): mtp-smollm2-135m.safetensors (the head,
bfloat16), draft-smollm2-135m.safetensors (the draft's own layers and norm, bfloat16),
drafters.json (recipes, training curves, split, metrics, file sizes) and drafters.md (the tables).
To ship: copy the head to specbench/assets/mtp/smollm2-135m.safetensors and the draft to
specbench/assets/draft/smollm2-135m.safetensors.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from specbench import load  # noqa: E402
from specbench.common.files import write_json_atomic, write_safetensors_atomic, write_text_atomic  # noqa: E402
from specbench.core.engine import generate  # noqa: E402
from specbench.core.forward import text_model  # noqa: E402
from specbench.core.options import GenerateOptions  # noqa: E402
from specbench.core.policies import DraftPolicy  # noqa: E402
from specbench.drafters import DraftModel, EarlyExit, MtpDrafter  # noqa: E402
from specbench.drafters.draft_model import draft_metadata, draft_own_tensors  # noqa: E402
from specbench.experiments.draft_training import HELDOUT_KINDS, heldout_split, train_draft  # noqa: E402
from specbench.experiments.mtp_data import WindowSampler  # noqa: E402
from specbench.experiments.mtp_metrics import evaluate_decoding  # noqa: E402
from specbench.experiments.mtp_training import TrainConfig, build_data, train_head  # noqa: E402
from specbench.experiments.prompt_runs import run_mlx_lm, run_specbench  # noqa: E402
from specbench.models.load import cast_dtype  # noqa: E402
from specbench.models.mtp.attach import load_head, save_head, shipped_head  # noqa: E402
from specbench.models.mtp.head import model_type  # noqa: E402

NAME = "smollm2-135m"
K = 3


def log(text: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {text}", flush=True)


def configs(quick: bool) -> tuple[TrainConfig, dict]:
    if quick:  # a smoke run: this CPU's matmuls run at a few GFLOP/s, so every shape is minimal
        config = TrainConfig.quick()
        config.steps, config.batch_size, config.seq_len, config.warmup_steps = 2, 1, 16, 1
        config.chat_prompts, config.continuation_prompts, config.continuation_prompt_tokens = 0, 2, 8
        config.chat_tokens = config.continuation_tokens = 6
        config.text_chars, config.eval_windows, config.generation_batch = 30_000, 0, 2
        settings = {"per_kind": 1, "tokens": 6, "prompt_tokens": 16, "exits": [15], "eval_reserve": 0.0}
        return config, {**settings, "skip": ["mtp (shipped)"]}
    config = TrainConfig(
        steps=1_000_000,
        batch_size=64,
        seq_len=256,
        learning_rate=1e-3,
        min_learning_rate=5e-5,
        warmup_steps=100,
        text_chars=12_000_000,
        chat_prompts=8192,
        chat_tokens=192,
        continuation_prompts=6144,
        continuation_tokens=128,
        generation_batch=512,
        generation_budget_s=60.0,
        eval_windows=8,
    )
    return config, {"per_kind": 8, "tokens": 64, "prompt_tokens": 64, "exits": [8, 15, 22], "eval_reserve": 110.0}


def shorten_chat(split: dict, tokens: int) -> None:
    """Smoke runs only: keep the last ``tokens`` tokens of each chat prompt (the template's end)."""
    split["prompts"]["chat"] = [p[-tokens:] for p in split["prompts"]["chat"]]


def warm_up(model) -> None:
    """Build the kernels of the training shapes once, untimed in the training budget."""
    tokens = mx.zeros((1, 8), dtype=mx.uint32)
    mx.eval(model(tokens))
    log("warmed up")


def evaluate(name: str, model, split: dict, settings: dict, factory) -> dict:
    rows = {}
    for kind in HELDOUT_KINDS:
        prompts = split["prompts"][kind]
        rows[kind] = evaluate_decoding(model, prompts, settings["tokens"], K, "fast", drafter_factory=factory)
        r = rows[kind]
        log(
            f"{name:14s} {kind:8s} per position "
            + " ".join(f"{p:.2f}" for p in r["per_position_acceptance"])
            + "  conditional "
            + " ".join(f"{p:.2f}" for p in r["conditional_acceptance"])
            + f"  tokens/verify {r['tokens_per_verify']:.2f}  {r['seconds']:.1f}s"
        )
    return rows


def plain_seconds(model, split: dict, settings: dict) -> dict:
    out = {}
    for kind in HELDOUT_KINDS:
        t0 = time.perf_counter()
        for prompt in split["prompts"][kind]:
            for _ in generate(model, list(prompt), GenerateOptions(max_tokens=settings["tokens"])):
                pass
        out[kind] = round(time.perf_counter() - t0, 2)
    return out


def versus_mlx_lm(model, tokenizer, draft_model, split: dict, settings: dict) -> dict:
    """The draft model through specbench (DraftModel, fixed k = 3) and through mlx-lm's
    speculative_generate_step (num_draft_tokens = 3), the same pair and prompts, greedy: tokens/s ratio and
    acceptance per kind."""
    out = {}
    for kind in HELDOUT_KINDS:
        ours = [
            run_specbench(
                model,
                tokenizer,
                p,
                settings["tokens"],
                DraftModel(draft_model, target=model),
                DraftPolicy.fixed(K),
                "fast",
            )
            for p in split["prompts"][kind]
        ]
        theirs = [run_mlx_lm(model, tokenizer, p, settings["tokens"], draft_model, K) for p in split["prompts"][kind]]

        def rate(runs):
            return sum(len(r.tokens) for r in runs) / max(sum(r.wall_s for r in runs), 1e-9)

        def acceptance(runs):
            return sum(r.accepted for r in runs) / max(sum(r.drafted for r in runs), 1)

        out[kind] = {
            "tokens_per_s_ratio": rate(ours) / rate(theirs),
            "specbench_tokens_per_s": rate(ours),
            "mlx_lm_tokens_per_s": rate(theirs),
            "specbench_acceptance": acceptance(ours),
            "mlx_lm_acceptance": acceptance(theirs),
        }
        log(f"draft-model vs mlx-lm {kind}: " + ", ".join(f"{k} {v:.2f}" for k, v in out[kind].items()))
    return out


def table(results: dict) -> str:
    lines = [
        "Greedy speculative decoding, fixed k = 3, fast verification; acceptance of draft position 1, 2, 3 "
        "(cumulative: share of verifications accepting that position; conditional: given the ones before); "
        "speed: plain decoding's seconds over the drafter's on the same prompts.",
        "",
        "| drafter | kind | pos 1 | pos 2 | pos 3 | cond 2 | cond 3 | tokens/verify | speed vs plain |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    plain = results.get("plain_seconds", {})
    for name, rows in results["evaluation"].items():
        for kind, r in rows.items():
            p, c = r["per_position_acceptance"], r["conditional_acceptance"]
            speed = plain.get(kind, float("nan")) / r["seconds"] if r["seconds"] else float("nan")
            lines.append(
                f"| {name} | {kind} | {p[0]:.2f} | {p[1]:.2f} | {p[2]:.2f} | {c[1]:.2f} | {c[2]:.2f} | "
                f"{r['tokens_per_verify']:.2f} | {speed:.2f} |"
            )
    if results.get("versus_mlx_lm"):
        lines.append("")
    for kind, r in results.get("versus_mlx_lm", {}).items():
        lines.append(
            f"draft model, specbench / mlx-lm speculative_generate_step ({kind}): tokens/s "
            f"{r['tokens_per_s_ratio']:.2f}x, acceptance {r['specbench_acceptance']:.2f} / {r['mlx_lm_acceptance']:.2f}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds in all, evaluation included")
    parser.add_argument("--draft-layers", type=int, default=2, help="decoder layers of the draft model")
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="folder holding spec-bench/")
    parser.add_argument("--out", default=None, help="output folder (default $OUT, else reports/gpu)")
    args = parser.parse_args()
    out = Path(args.out or os.environ.get("OUT") or "reports/gpu")
    out.mkdir(parents=True, exist_ok=True)
    deadline = START + args.budget
    gpu = mx.default_device().type == mx.DeviceType.gpu
    model, tokenizer = load(NAME, dtype="bfloat16" if gpu else "float32")
    dtype = text_model(model).model.norm.weight.dtype
    log(f"model loaded on {mx.default_device()} ({dtype})")
    config, settings = configs(args.quick)
    warm_up(model)
    split = heldout_split(tokenizer, args.data, settings["per_kind"], settings["prompt_tokens"])
    if args.quick:
        shorten_chat(split, settings["prompt_tokens"])
    results: dict = {
        "model": NAME,
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
        "budget_s": args.budget,
        "split": {"sources": split["sources"], "mean_prompt_tokens": split["mean_prompt_tokens"]},
        "evaluation": {},
    }
    json_path = out / "drafters.json"

    streams, _, data_info = build_data(model, tokenizer, config, log)
    results["data"] = data_info
    sampler = WindowSampler(streams, config.mix, config.seq_len, config.seed)
    left = deadline - time.perf_counter() - settings["eval_reserve"]
    head_budget, draft_budget = 0.55 * left, 0.45 * left
    log(f"training budgets: head {head_budget:.0f}s, draft {draft_budget:.0f}s")

    config.time_budget_s = None if args.quick else max(10.0, head_budget)
    head, head_record = train_head(model, sampler, config, log)
    cast_dtype(head, dtype)
    args_ = text_model(model).args
    model_config = {k: getattr(args_, k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")}
    model_config["model_type"] = model_type(model)
    head_file = save_head(head, out / f"mtp-{NAME}.safetensors", model_config, {"model": NAME})
    results["mtp"] = {"recipe": {"depth": config.depth, "depth_decay": config.depth_decay}, "training": head_record}
    write_json_atomic(json_path, results)

    config.time_budget_s = None if args.quick else max(10.0, deadline - time.perf_counter() - settings["eval_reserve"])
    config.learning_rate, config.warmup_steps = 3e-4, min(config.warmup_steps, 50)
    draft, draft_record = train_draft(model, sampler, config, args.draft_layers, log)
    own = {k: v.astype(mx.bfloat16) for k, v in draft_own_tensors(draft).items()}
    meta = draft_metadata(args.draft_layers, NAME, {"source_layers": draft_record["source_layers"]})
    draft_file = write_safetensors_atomic(out / f"draft-{NAME}.safetensors", own, meta)
    results["draft_model"] = {"layers": args.draft_layers, "training": draft_record}
    results["files"] = {p.name: p.stat().st_size for p in (head_file, draft_file)}
    results["parameters"] = {
        "mtp_head": int(sum(v.size for _, v in tree_flatten(head.parameters()))),
        "draft_own": int(sum(v.size for v in own.values())),
    }
    write_json_atomic(json_path, results)
    log(f"files: {results['files']}")

    from specbench.drafters.draft_model import load_draft_model

    shipped_draft = load_draft_model(model, draft_file)  # as shipped: bfloat16 layers, the target's embeddings
    old_head = load_head(model, shipped_head(NAME))
    candidates = [
        ("mtp (new)", lambda: MtpDrafter(model, head=head)),
        ("draft-model", lambda: DraftModel(shipped_draft, target=model)),
        ("versus mlx-lm", None),
        ("plain", None),
        ("mtp (shipped)", lambda: MtpDrafter(model, head=old_head)),
        *((f"early-exit:{n}", lambda n=n: EarlyExit(model, n)) for n in settings["exits"]),
    ]
    last_s = 0.0  # seconds the last phase took: a phase is skipped when as many are not left
    for name, factory in candidates:
        if name in settings.get("skip", []):
            continue
        if not args.quick and time.perf_counter() + last_s > deadline and results["evaluation"]:
            log(f"{name}: skipped, it would overrun the budget")
            results.setdefault("skipped", []).append(name)
            continue
        t0 = time.perf_counter()
        if name == "versus mlx-lm":
            results["versus_mlx_lm"] = versus_mlx_lm(model, tokenizer, shipped_draft, split, settings)
        elif name == "plain":
            results["plain_seconds"] = plain_seconds(model, split, settings)
        else:
            results["evaluation"][name] = evaluate(name, model, split, settings, factory)
            results["cost_per_token"] = {**results.get("cost_per_token", {}), name: factory().cost_per_token}
        last_s = time.perf_counter() - t0
        write_json_atomic(json_path, results)
    results["seconds_total"] = round(time.perf_counter() - START, 1)
    write_json_atomic(json_path, results)
    text = table(results)
    write_text_atomic(out / "drafters.md", text + "\n")
    print()
    print(text)
    print(f"\nfiles in {out}: {', '.join(f'{k} ({v / 1e6:.1f} MB)' for k, v in results['files'].items())}")
    print(f"total {results['seconds_total']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
