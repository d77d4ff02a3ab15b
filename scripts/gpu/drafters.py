"""Retrain the MTP head of the embedded model (SmolLM2-135M), distil a small draft model for it, and
measure both, with the shipped head and early exit, on a held-out split of three kinds.

    python3 -m scripts.gpu.drafters                   # H200, about 7 minutes (--budget 420 s in all)
    python3 -m scripts.gpu.drafters --evaluate-only   # H200, about 4 minutes (--budget 360 s): what ships, no training
    python3 -m scripts.gpu.drafters --quick           # CPU smoke run: tiny data, 2 steps each, every phase run

Phases (each bounded by the budget; files are written as soon as they exist):
1. data: the model's own greedy answers to chat prompts the project writes (templates over topics,
   coding tasks, arithmetic, standard-library names and passages of package documents) and its
   continuations of code and text snippets, plus standard-library code and docstrings and package
   documents (``specbench.train.mtp_data``; Spec-Bench is never read for training);
2. the MTP head, every draft position trained (the head fed its own chained states, positions
   1..3; ``chain_loss``), initialised from the last body layer;
3. the new head and the shipped head on the held-out split: both tables are printed, and the new
   head is written to the output only when it beats the shipped one (higher mean tokens per
   verification over the three kinds);
4. a draft model: ``--draft-layers`` decoder layers of SmolLM2's width with a narrower MLP
   (``--draft-mlp`` channels, those of most weight in the source layers), initialised from layers
   spread over the depth and distilled on the same windows (soft cross-entropy to the target's
   next-token distribution at every position); embeddings and output head are the target's,
   frozen and not stored, so the file holds the draft's own layers (bfloat16, under 8 MB);
5. evaluation: greedy speculative decoding (fixed k = 3, fast verification) on the held-out split
   (``specbench.train.draft_training.heldout_split``: Spec-Bench chat first turns with the
   chat template, Spec-Bench summarization articles as plain text, held-out standard-library code;
   the rule is fixed in that module) of the draft model; the draft model through specbench and
   through mlx-lm's speculative_generate_step (same pair, k = 3): tokens/s ratio and acceptance
   per kind and per bundled prompt category; plain decoding (each drafter's speed ratio, and its
   measured draft seconds per token over a plain step); early exit: a sweep of exit layers on a
   sample of the split, and the best L's acceptance on the whole split.

--evaluate-only trains nothing (phases 1, 2 and 4 are skipped): it evaluates what ships, the MTP head
(specbench/assets/mtp) and the draft model (specbench/assets/draft), as phase 5 does, with the draft
model against mlx-lm on every bundled prompt category (two prompts each) and the three kinds.

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
import numpy as np
from mlx.utils import tree_flatten

from specbench import load
from specbench.bench.prompt_runs import run_mlx_lm, run_specbench
from specbench.common.files import write_json_atomic, write_safetensors_atomic, write_text_atomic
from specbench.core.engine import generate
from specbench.core.forward import text_model
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.drafters import (
    DraftModel,
    EarlyExit,
    MtpHead,
    best_exit_layer,
    make_drafter,
    shipped_draft_model,
    sweep_exit_layers,
)
from specbench.drafters.draft_model import (
    draft_metadata,
    draft_own_tensors,
    load_draft_model,
)
from specbench.inputs.prompts import bundled_questions, render_prompt
from specbench.models.embedded import shipped_draft_path
from specbench.models.load import cast_dtype
from specbench.models.mtp.attach import load_head, save_head, shipped_head
from specbench.models.mtp.head import model_type
from specbench.train.draft_training import HELDOUT_KINDS, heldout_split, train_draft
from specbench.train.mtp_data import WindowSampler
from specbench.train.mtp_metrics import evaluate_decoding
from specbench.train.mtp_training import TrainConfig, build_data, train_head

START = time.perf_counter()
ROOT = Path(__file__).resolve().parents[2]

NAME = "smollm2-135m"
K = 3
#: Issue targets for the MTP head: position 1, and positions 2 and 3 (cumulative), on every kind.
TARGETS = (0.55, 0.35, 0.35)
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
        settings = {
            "per_kind": 1,
            "tokens": 3,
            "prompt_tokens": 12,
            "exits": [28],
            "sweep_per_kind": 1,
            "sweep_prompts": 1,
        }
        return config, {
            **settings,
            "sweep_tokens": 3,
            "categories": 1,
            "per_category": 1,
            "versus_kinds": 1,
            "head_eval_s": 0.0,
            "draft_eval_s": 0.0,
        }
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
    return config, {
        **settings,
        "sweep_prompts": 2 * len(HELDOUT_KINDS),
        "sweep_tokens": 32,
        "categories": 8,
        "per_category": 1,
        "versus_kinds": len(HELDOUT_KINDS),
        "head_eval_s": HEAD_EVAL_S,
        "draft_eval_s": DRAFT_EVAL_S,
    }


def warm_up(model) -> None:
    """Build the kernels of the training shapes once, untimed in the training budget."""
    mx.eval(model(mx.zeros((1, 8), dtype=mx.uint32)))
    log("warmed up")


def evaluate(name: str, model, split: dict, settings: dict, factory) -> dict:
    """Per kind: ``evaluate_decoding``'s metrics, and the drafter's weight bytes per drafted token over a plain
    step's (``cost_per_token``)."""
    rows = {}
    bytes_share = factory().cost_per_token
    for kind in HELDOUT_KINDS:
        rows[kind] = r = evaluate_decoding(
            model, split["prompts"][kind], settings["tokens"], K, "fast", drafter_factory=factory
        )
        r["cost_per_token"] = bytes_share
        log(
            f"{name:14s} {kind:8s} per position "
            + " ".join(f"{p:.2f}" for p in r["per_position_acceptance"])
            + "  conditional "
            + " ".join(f"{p:.2f}" for p in r["conditional_acceptance"])
            + f"  tokens/verify {r['tokens_per_verify']:.2f}  {r['seconds']:.1f}s"
        )
    return rows


def score(rows: dict) -> float:
    """Mean tokens per verification over the kinds (what decides which head ships)."""
    return float(np.mean([rows[kind]["tokens_per_verify"] for kind in HELDOUT_KINDS]))


def meets_targets(rows: dict) -> bool:
    return all(
        p >= t for kind in HELDOUT_KINDS for p, t in zip(rows[kind]["per_position_acceptance"], TARGETS, strict=True)
    )


def plain_seconds(model, split: dict, settings: dict) -> dict:
    out = {}
    for kind in HELDOUT_KINDS:
        t0, tokens = time.perf_counter(), 0
        for prompt in split["prompts"][kind]:
            tokens += sum(1 for _ in generate(model, list(prompt), GenerateOptions(max_tokens=settings["tokens"])))
        out[kind] = {"seconds": round(time.perf_counter() - t0, 3), "tokens": tokens}
    log("plain: " + ", ".join(f"{k} {v['seconds']:.1f}s" for k, v in out.items()))
    return out


def versus_mlx_lm(model, tokenizer, draft_model, prompts: dict, tokens: int, deadline: float, results: dict) -> dict:
    """The draft model through specbench (DraftModel, fixed k = 3) and through mlx-lm's
    speculative_generate_step (num_draft_tokens = 3), the same pair and prompts, greedy: tokens/s ratio,
    acceptance and whether the outputs are equal, per group of prompts. Both engines run once untimed
    first (kernel builds); a group that would overrun the budget (at the pace of the groups before) is
    skipped and recorded."""

    def specbench_run(prompt, max_tokens):
        drafter = DraftModel(draft_model, target=model)
        return run_specbench(model, tokenizer, prompt, max_tokens, drafter, DraftPolicy.fixed(K), "fast")

    shortest = min((p for group in prompts.values() for p in group), key=len)[-8:]
    specbench_run(shortest, 2), run_mlx_lm(model, tokenizer, shortest, 2, draft_model, K)
    out, pace = {}, 0.0
    for group, group_prompts in prompts.items():
        if over_budget(f"versus mlx-lm:{group}", deadline, pace * len(group_prompts), results):
            continue
        t0 = time.perf_counter()
        ours = [specbench_run(p, tokens) for p in group_prompts]
        theirs = [run_mlx_lm(model, tokenizer, p, tokens, draft_model, K) for p in group_prompts]
        pace = max(pace, 1.5 * (time.perf_counter() - t0) / len(group_prompts))

        def rate(runs):
            return sum(len(r.tokens) for r in runs) / max(sum(r.wall_s for r in runs), 1e-9)

        def acceptance(runs):
            return sum(r.accepted for r in runs) / max(sum(r.drafted for r in runs), 1)

        equal = sum(a.tokens == b.tokens for a, b in zip(ours, theirs, strict=True))
        out[group] = {
            "tokens_per_s_ratio": rate(ours) / rate(theirs),
            "specbench_tokens_per_s": rate(ours),
            "mlx_lm_tokens_per_s": rate(theirs),
            "specbench_acceptance": acceptance(ours),
            "mlx_lm_acceptance": acceptance(theirs),
            "prompts": len(group_prompts),
            "tokens": sum(len(r.tokens) for r in ours),
            "outputs_equal": equal,
        }
        log(f"draft-model vs mlx-lm {group}: " + ", ".join(f"{k} {v:.2f}" for k, v in out[group].items()))
    return out


def category_prompts(tokenizer, per_category: int, last_tokens: int | None = None) -> dict:
    """The bundled prompts' first turns with the chat template, by category (only their last
    ``last_tokens`` tokens when given: smoke runs)."""
    groups: dict = {}
    for q in bundled_questions():
        if len(groups.setdefault(q.category, [])) < per_category:
            groups[q.category].append(render_prompt(tokenizer, q.turns[0])[-(last_tokens or 0) :])
    return groups


def rows_table(evaluation: dict, plain: dict) -> list[str]:
    lines = [
        "| drafter | kind | pos 1 | pos 2 | pos 3 | cond 2 | cond 3 | tokens/verify | speed vs plain | draft s/token "
        "/ plain step |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in evaluation.items():
        for kind, r in rows.items():
            p, c = r["per_position_acceptance"], r["conditional_acceptance"]
            base = plain.get(kind)
            speed = base["seconds"] / r["seconds"] if base and r["seconds"] else float("nan")
            step = base["seconds"] / max(base["tokens"], 1) if base else float("nan")
            d = r.get("draft_seconds_per_token", float("nan")) / step
            lines.append(
                f"| {name} | {kind} | {p[0]:.2f} | {p[1]:.2f} | {p[2]:.2f} | {c[1]:.2f} | {c[2]:.2f} | "
                f"{r['tokens_per_verify']:.2f} | {speed:.2f} | {d:.2f} |"
            )
    return lines


def report(results: dict) -> str:
    lines = [
        "Greedy speculative decoding, fixed k = 3, fast verification, held-out split; acceptance of draft position "
        "1, 2, 3 (cumulative: share of verifications accepting that position; conditional: given the ones before); "
        "speed: plain decoding's seconds over the drafter's on the same prompts; draft cost: the drafter's seconds "
        "per drafted token over plain decoding's seconds per token.",
        "",
        *rows_table(results["evaluation"], results.get("plain", {})),
    ]
    head = results.get("mtp", {}).get("decision")
    if head:
        lines += ["", head]
    sweep = results.get("early_exit", {})
    if sweep.get("sweep"):
        lines += [
            "",
            "Early exit sweep (sample of the split): L, position-1 acceptance, tokens/verify, modelled speedup",
        ]
        lines += [
            f"- L = {r['layers']}/{r['of_layers']}: {r['first_draft_acceptance']:.2f}, {r['tokens_per_verify']:.2f}, "
            f"{r['modeled_speedup']:.2f}"
            for r in sweep["sweep"]
        ]
        lines.append(f"best L = {sweep['best_layers']}")
    if results.get("versus_mlx_lm"):
        lines += ["", *versus_table(results["versus_mlx_lm"])]
    if results.get("skipped"):
        lines += ["", "skipped (they would have overrun the budget): " + ", ".join(results["skipped"])]
    return "\n".join(lines)


def versus_table(versus: dict) -> list[str]:
    """Per kind and bundled category: the draft model through specbench and through mlx-lm."""
    lines = [
        "Draft model, the same pair through specbench (DraftModel, k = 3) and mlx-lm's speculative_generate_step "
        "(num_draft_tokens = 3), greedy, per held-out kind and bundled prompt category:",
        "",
        "| group | prompts | tokens | specbench / mlx-lm tokens/s | specbench tok/s | mlx-lm tok/s | "
        "specbench acceptance | mlx-lm acceptance | outputs equal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for group, r in versus.items():
        equal = "yes" if r["outputs_equal"] == r["prompts"] else f"{r['outputs_equal']} of {r['prompts']}"
        lines.append(
            f"| {group} | {r['prompts']} | {r['tokens']} | {r['tokens_per_s_ratio']:.2f}x | "
            f"{r['specbench_tokens_per_s']:.1f} | {r['mlx_lm_tokens_per_s']:.1f} | {r['specbench_acceptance']:.2f} | "
            f"{r['mlx_lm_acceptance']:.2f} | {equal} |"
        )
    return lines


def over_budget(name: str, deadline: float, need_s: float, results: dict) -> bool:
    if time.perf_counter() + need_s <= deadline:
        return False
    log(f"{name}: skipped, it would overrun the budget")
    results.setdefault("skipped", []).append(name)
    return True


def train_and_evaluate(args, model, tokenizer, split, config, settings, results, deadline, out) -> dict[str, Path]:
    """Phases 1-5: the data, the new head against the shipped one, the draft model, then the shared
    evaluation (``compare_and_sweep``); returns the files written to ship."""
    json_path = out / "drafters.json"
    dtype = text_model(model).model.norm.weight.dtype
    files: dict[str, Path] = {}
    # -- data and the head ------------------------------------------------------------------------
    streams, _, data_info = build_data(model, tokenizer, config, log)
    results["data"] = data_info
    sampler = WindowSampler(streams, config.mix, config.seq_len, config.seed)
    train_s = deadline - time.perf_counter() - settings["head_eval_s"] - settings["draft_eval_s"]
    config.time_budget_s = None if args.quick else max(10.0, args.head_share * train_s)
    log(f"head training budget {config.time_budget_s or 0:.0f}s (training time left {train_s:.0f}s)")
    head, head_record = train_head(model, sampler, config, log)
    cast_dtype(head, dtype)
    results["mtp"] = {
        "recipe": {"depth": config.depth, "depth_decay": config.depth_decay, "mix": config.mix, "init": config.init},
        "training": head_record,
    }
    write_json_atomic(json_path, results)

    results["evaluation"]["mtp (new)"] = new = evaluate(
        "mtp (new)", model, split, settings, lambda: MtpHead(model, head=head)
    )
    old_head = load_head(model, shipped_head(NAME))
    results["evaluation"]["mtp (shipped)"] = old = evaluate(
        "mtp (shipped)", model, split, settings, lambda: MtpHead(model, head=old_head)
    )
    wins = score(new) > score(old)
    results["mtp"].update(
        {"new_score": score(new), "shipped_score": score(old), "new_meets_targets": meets_targets(new), "ships": wins}
    )
    results["mtp"]["decision"] = (
        f"MTP head: new {score(new):.3f} vs shipped {score(old):.3f} mean tokens/verify over the kinds: "
        + ("the new head ships" if wins else "the shipped head stays")
        + f"; the new head {'meets' if meets_targets(new) else 'does not meet'} the targets "
        f"(position 1 >= {TARGETS[0]}, positions 2-3 >= {TARGETS[1]} on every kind)"
    )
    log(results["mtp"]["decision"])
    if wins:
        args_ = text_model(model).args
        model_config = {k: getattr(args_, k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")}
        model_config["model_type"] = model_type(model)
        cast_dtype(head, mx.bfloat16)
        files["mtp"] = save_head(head, out / f"mtp-{NAME}.safetensors", model_config, {"model": NAME})
        record = {"model": NAME, "recipe": results["mtp"]["recipe"], "data": data_info, "training": head_record}
        record["heldout_split"] = {"sources": split["sources"], "k": K, "tokens": settings["tokens"]}
        record["metrics"] = {"decoding_heldout": new, "replaced_head_decoding_heldout": old}
        files["mtp_record"] = write_json_atomic(out / f"mtp-{NAME}.json", record)
    write_json_atomic(json_path, results)

    # -- the draft model ----------------------------------------------------------------------------
    config.time_budget_s = None if args.quick else max(10.0, deadline - time.perf_counter() - settings["draft_eval_s"])
    config.learning_rate, config.warmup_steps = 3e-4, min(config.warmup_steps, 50)
    log(f"draft training budget {config.time_budget_s or 0:.0f}s")
    draft, draft_record = train_draft(model, sampler, config, args.draft_layers, log, args.draft_mlp)
    own = {k: v.astype(mx.bfloat16) for k, v in draft_own_tensors(draft).items()}
    meta = draft_metadata(args.draft_layers, NAME, {"source_layers": draft_record["source_layers"]}, args.draft_mlp)
    files["draft"] = write_safetensors_atomic(out / f"draft-{NAME}.safetensors", own, meta)
    results["draft_model"] = {
        "layers": args.draft_layers,
        "intermediate_size": args.draft_mlp,
        "training": draft_record,
    }
    results["files"] = {p.name: p.stat().st_size for p in files.values()}
    results["parameters"] = {
        "mtp_head": int(sum(v.size for _, v in tree_flatten(head.parameters()))),
        "draft_own": int(sum(v.size for v in own.values())),
    }
    write_json_atomic(json_path, results)
    log(f"files: {results['files']}")

    shipped_draft = load_draft_model(model, files["draft"])  # as shipped: bfloat16 layers, the target's embeddings
    results["evaluation"]["draft-model"] = evaluate(
        "draft-model", model, split, settings, lambda: DraftModel(shipped_draft, target=model)
    )
    write_json_atomic(json_path, results)
    compare_and_sweep(model, tokenizer, split, settings, results, deadline, shipped_draft, json_path, args.quick)
    return files


def compare_and_sweep(model, tokenizer, split, settings, results, deadline, draft, json_path, quick) -> None:
    """Plain decoding on the split, ``draft`` through specbench and mlx-lm per kind and bundled category,
    and early exit: a sweep of exit layers on a sample of the split, the best L on the whole split."""
    if not over_budget("plain", deadline, NEEDS_S["plain"], results):
        results["plain"] = plain_seconds(model, split, settings)
    last = settings["prompt_tokens"] if quick else None
    by_length = sorted(category_prompts(tokenizer, settings["per_category"], last).items(), key=lambda i: len(i[1][0]))
    categories = dict(by_length[: settings["categories"]])  # the shortest prompts first
    groups = {**{k: split["prompts"][k] for k in HELDOUT_KINDS[: settings["versus_kinds"]]}, **categories}
    if not over_budget("versus mlx-lm", deadline, NEEDS_S["versus mlx-lm"], results):
        results["versus_mlx_lm"] = versus_mlx_lm(model, tokenizer, draft, groups, settings["tokens"], deadline, results)
    write_json_atomic(json_path, results)

    if not over_budget("early exit", deadline, NEEDS_S["early exit"], results):
        sample = [p for kind in HELDOUT_KINDS for p in split["prompts"][kind][: settings["sweep_per_kind"]]]
        sample = sample[: settings["sweep_prompts"]]
        sweep = sweep_exit_layers(model, sample, settings["exits"], K, settings["sweep_tokens"])
        best = best_exit_layer(sweep)
        results["early_exit"] = {"sweep": sweep, "best_layers": best}
        log(f"early exit sweep: best L = {best} of {sweep[0]['of_layers']}")
        if not over_budget(f"early-exit:{best}", deadline, NEEDS_S["early-exit eval"], results):
            results["evaluation"][f"early-exit:{best}"] = evaluate(
                f"early-exit:{best}", model, split, settings, lambda: EarlyExit(model, best)
            )
    write_json_atomic(json_path, results)


def evaluate_shipped(model, tokenizer, split, settings, results, deadline, json_path, quick) -> None:
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
    compare_and_sweep(model, tokenizer, split, settings, results, deadline, draft, json_path, quick)
    if not over_budget("draft-model", deadline, NEEDS_S["drafter eval"], results):
        results["evaluation"]["draft-model"] = evaluate(
            "draft-model", model, split, settings, lambda: make_drafter("draft-model", model, NAME, draft_model=draft)
        )
        write_json_atomic(json_path, results)
    if not over_budget("mtp (shipped)", deadline, NEEDS_S["drafter eval"], results):
        head = load_head(model, head_path)
        results["evaluation"]["mtp (shipped)"] = evaluate(
            "mtp (shipped)", model, split, settings, lambda: MtpHead(model, head=head)
        )


def finish(results: dict, files: dict[str, Path], out: Path) -> None:
    """Write drafters.json and drafters.md, print the tables and the copy commands that ship the files."""
    results["seconds_total"] = round(time.perf_counter() - START, 1)
    write_json_atomic(out / "drafters.json", results)
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
    parser.add_argument("--quick", action="store_true", help="CPU smoke run")
    parser.add_argument(
        "--evaluate-only",
        action="store_true",
        help="train nothing: evaluate the shipped MTP head and draft model, plain decoding, mlx-lm, early exit",
    )
    parser.add_argument(
        "--budget", type=float, default=None, help="seconds in all, evaluation included (420; 360 --evaluate-only)"
    )
    parser.add_argument("--draft-layers", type=int, default=2, help="decoder layers of the draft model")
    parser.add_argument("--draft-mlp", type=int, default=512, help="MLP channels of the draft's layers")
    parser.add_argument("--head-share", type=float, default=0.7, help="share of the training time for the head")
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="folder holding spec-bench/")
    parser.add_argument("--out", default=None, help="output folder (default $OUT, else reports/gpu)")
    parser.add_argument(
        "--allow-fallback",
        action="store_true",
        help="without Spec-Bench's question.jsonl, judge on the bundled prompts and held-out package documents",
    )
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
    deadline = START + args.budget
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
        evaluate_shipped(model, tokenizer, split, settings, results, deadline, json_path, args.quick)
        files: dict[str, Path] = {}
    else:
        files = train_and_evaluate(args, model, tokenizer, split, config, settings, results, deadline, out)
    finish(results, files, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
