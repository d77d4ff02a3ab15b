"""Token trees against paths on the device: traces, verify cost by node count, controlled acceptance.

    python3 -m scripts.gpu.trees --budget 240   # H200, about 5 minutes
    python3 -m scripts.gpu.trees --quick        # CPU smoke run: tiny shapes, a few tokens, under a minute

1. Traces (the embedded SmolLM2-135M; first, within 45 % of --budget): the model's greedy outputs
   (--trace-tokens per turn) on every turn of data/traces (recorded history as prompts); the simulator
   replays SuffixDecoding (back-off trees), SuffixDecoding with the reference's one-match trees and
   prompt lookup as paths and as trees at node budgets --sim-budgets (``specbench.simulate.simulate``);
   then real runs of SuffixDecoding path and tree (exact and fast, --suffix-budget nodes) on the same
   prompts: wall time, speedup, and whether each real run's steps equal the simulator's. Auto's node
   budget (``AutoPolicy.choose_node_budget``) from the simulated tokens per verification and the
   embedded model's tree costs.
2. MTP trees (the embedded model with its shipped MTP head; within the next 15 %): the bundled prompts
   (--mtp-prompts categories, first question each, --mtp-tokens tokens) drafted as the head's greedy chain
   (3 tokens), the static tree (chain + runners-up, 6 nodes) and EAGLE-2's dynamic tree (top-k 3, depth 4,
   8 nodes; top-k 4, depth 5, 16 nodes), exact and fast: tokens per verification, nodes, speedup,
   identical to plain.
3. Verify cost by node count (within the next 20 %): trees of n nodes against paths of n tokens
   (``specbench.cost.trees``) on the embedded model and the ``synthetic:`` dense qwen3-8b-4bit and MoE
   qwen3-30b-a3b-4bit shapes at --layers depth; fast mode, and exact mode for up to 8 nodes.
4. Controlled acceptance (the rest): the shapes' plain greedy continuation drafted as a path of
   --path-k tokens (each position kept with probability a) or as a tree of --branches such drafts
   (independent corruptions, merged where they agree) of --tree-depth tokens each; plain, path and tree
   decoding of --prompts random prompts x --tokens tokens in exact and fast verify mode: wall time,
   tokens per verification, speedup over plain, output identical to plain.

Writes into $OUT (or --out; default reports/gpu-trees): traces_sim.csv, traces_real.csv, mtp_trees.csv,
tree_costs.csv, controlled.csv, summary.json (with what the budget left out); prints the tables. Stops
starting new work once --budget seconds are spent.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import polars as pl

from scripts.gpu.budget import Budget
from scripts.gpu.tree_bench import suffix_real_row, timed, tree_verifiers
from specbench.common.files import write_csv_atomic
from specbench.common.identity import device_name, write_result
from specbench.core.forward import vocab_size
from specbench.core.options import GenerateOptions
from specbench.core.policies import AutoPolicy
from specbench.cost.trees import NODE_COUNTS, measure_tree_costs, tree_break_even
from specbench.drafters.mtp import MtpHead, mtp_head_for
from specbench.drafters.oracle import Oracle, OracleTree
from specbench.inputs.importers import load_traces
from specbench.inputs.prompts import bundled_questions, render_prompt, select_questions
from specbench.inputs.traces import bundled_traces
from specbench.models.load import load
from specbench.models.mtp import build_head
from specbench.simulate.simulate import (
    ALL_TREE_DRAFTERS,
    Recorded,
    compare_trees,
    record_groups,
    trace_groups,
    tree_gain,
)


def tokens_by_budget(table, drafter: str, mode: str = "tree") -> dict[int, float]:
    """``compare_trees``' tokens per verification of ``drafter`` in ``mode`` for each node budget, pooled over
    traces (verifications weighted): what ``AutoPolicy.choose_node_budget`` chooses from."""
    rows = table.filter((pl.col("drafter") == drafter) & (pl.col("mode") == mode))
    pooled = rows.group_by("budget").agg((pl.col("accepted") + pl.col("verifies")).sum() / pl.col("verifies").sum())
    return {int(b): float(t) for b, t in pooled.iter_rows() if t == t}


def controlled(args, budget: Budget) -> list[dict]:
    """Plain, path and tree decoding of random prompts on each shape at controlled acceptance, exact and fast."""
    rows = []
    for name in args.models:
        if budget.over(f"controlled {name}"):
            continue
        model, _ = load(f"synthetic:{name}", layers=args.layers)
        vocab = vocab_size(model)
        rng = np.random.default_rng(0)
        prompts = [rng.integers(0, vocab, args.prompt_len).tolist() for _ in range(args.prompts)]
        options = GenerateOptions(max_tokens=args.tokens)
        verifiers = tree_verifiers(model, args.quick, max(args.path_k, args.branches * args.tree_depth) + 1)
        # Warm-up: kernels of every width, exact calibration.
        warm = prompts[0][: args.prompt_len // 2]
        for v in verifiers.values():
            oracle = Oracle.from_model(model, warm, 16, 0.7)
            timed(model, warm, GenerateOptions(max_tokens=16), v, oracle, args.path_k)
        for prompt in prompts:
            if budget.over(f"controlled {name}: prompts left"):
                break
            runs = [timed(model, prompt, options) for _ in range(2)]  # the faster of two plain runs
            plain, plain_s = runs[0][0], min(r[1] for r in runs)
            recorded = Oracle.from_model(model, prompt, args.tokens + 16, 1.0).recorded
            for a in args.acceptance:
                for mode, verifier in verifiers.items():
                    for shape in ("path", "tree"):
                        if shape == "path":
                            drafter, k = Oracle(prompt, recorded, a, vocab, seed=1), args.path_k
                        else:
                            oracles = [Oracle(prompt, recorded, a, vocab, seed=1 + b) for b in range(args.branches)]
                            drafter, k = OracleTree(oracles, args.tree_depth), args.branches * args.tree_depth
                        tokens, seconds, stats, _ = timed(model, prompt, options, verifier, drafter, k)
                        rows.append(
                            {
                                "model": name,
                                "layers": args.layers,
                                "acceptance": a,
                                "verify": mode,
                                "draft": shape,
                                "nodes": k,
                                "tokens": len(tokens),
                                "tokens_per_verify": round(stats["tokens_per_verify"], 3),
                                "plain_s": round(plain_s, 4),
                                "seconds": round(seconds, 4),
                                "speedup": round(plain_s / seconds, 3),
                                "identical": tokens == plain,
                            }
                        )
                        print(" ".join(f"{key}={value}" for key, value in rows[-1].items()), flush=True)
        del model
        mx.clear_cache()
    return rows


def traces(args, budget: Budget, until: float) -> tuple[list[dict], list[dict], dict, list[dict]]:
    """The simulator's trees against paths on every trace turn, SuffixDecoding's real runs (path and tree, exact
    and fast) against it, and Auto's node budget from the embedded model's tree costs."""
    model, tokenizer = load(args.trace_model)
    runs = [t for name in bundled_traces() for t in load_traces(name)]
    groups, _ = trace_groups(runs, tokenizer)
    if args.quick:
        groups = [(trace, lambda g=g: list(g())[:2]) for trace, g in groups[:2]]
    t0 = time.perf_counter()
    recorded = record_groups(model, tokenizer, groups, args.trace_tokens)
    print(f"recorded {len(recorded)} turns in {time.perf_counter() - t0:.1f} s", flush=True)
    table = compare_trees(recorded, drafters=ALL_TREE_DRAFTERS, budgets=sorted({*args.sim_budgets, args.suffix_budget}))
    print(tree_gain(table), flush=True)
    real_rows = []
    verifiers = tree_verifiers(model, args.quick, args.suffix_budget + 1)
    by_trace: dict[str, list[Recorded]] = {}
    for r in recorded:
        by_trace.setdefault(r.id.rsplit("/", 1)[0], []).append(r)
    options = GenerateOptions(max_tokens=args.trace_tokens)
    for trace, turns in by_trace.items():
        plain_s = sum(timed(model, turn.prompt, options, tokenizer=tokenizer)[1] for turn in turns)
        for mode, verifier in verifiers.items():
            for tree in (False, True):
                if budget.over(f"{trace} suffix {mode} {'tree' if tree else 'path'}", until=until):
                    break
                row = suffix_real_row(
                    model, tokenizer, turns, verifier, tree, args.suffix_budget, plain_s, args.trace_tokens
                )
                real_rows.append({"trace": trace, "verify": mode, **row})
                print(" ".join(f"{key}={value}" for key, value in real_rows[-1].items()), flush=True)
    # Auto's node budget for the suffix trees: simulated tokens per verification over the tree costs.
    costs = measure_tree_costs(model, nodes=NODE_COUNTS, repeats=3 if args.quick else 5)
    tokens = tokens_by_budget(table, "suffix")
    auto = {
        "tokens_per_verify": tokens,
        "c_tree": {n: round(costs.c(n), 3) for n in tokens},
        "chosen": AutoPolicy().choose_node_budget(tokens, tree_break_even(costs)),
    }
    print("Auto's node budget (embedded model, suffix trees):", auto, flush=True)
    rows = costs.to_polars().with_columns(pl.lit(args.trace_model).alias("shape")).to_dicts()
    return table.to_dicts(), real_rows, auto, rows


MTP_DRAFTS = (
    ("chain", {"preferred_k": 3}, 3),
    ("static-tree", {"tree_width": 2}, 6),
    ("dynamic-tree", {"top_k": 3, "tree_depth": 4}, 8),
    ("dynamic-tree", {"top_k": 4, "tree_depth": 5}, 16),
)


def mtp_trees(args, budget: Budget, until: float) -> list[dict]:
    """The embedded model's MTP head drafting a chain, a static tree and dynamic trees."""
    model, tokenizer = load(args.trace_model)
    if args.quick:
        model.mtp = build_head(model)  # the tiny twin has no shipped head: a random one
    else:
        mtp_head_for(model, args.trace_model)
    questions = select_questions(bundled_questions(), args.mtp_prompts, limit=1)
    prompts = [(q.category, render_prompt(tokenizer, q.turns[0])) for q in questions]
    options = GenerateOptions(max_tokens=args.mtp_tokens)
    verifiers = tree_verifiers(model, args.quick, max(n for *_, n in MTP_DRAFTS) + 1)
    rows = []
    for category, prompt in prompts:
        plain, plain_s = min(
            (timed(model, prompt, options, tokenizer=tokenizer)[:2] for _ in range(2)), key=lambda r: r[1]
        )
        for mode, verifier in verifiers.items():
            for shape, settings, nodes in MTP_DRAFTS:
                if budget.over(f"MTP {category} {mode} {shape}", until=until):
                    continue
                drafter = MtpHead(model, **settings)
                tokens, seconds, stats, gen = timed(model, prompt, options, verifier, drafter, nodes, tokenizer)
                verifies = [r for r in gen.log.records if r.kind == "verify"]
                rows.append(
                    {
                        "category": category,
                        "verify": mode,
                        "draft": shape,
                        "nodes": nodes,
                        "settings": json.dumps(settings),
                        "tokens": len(tokens),
                        "tokens_per_verify": round(stats["tokens_per_verify"], 3),
                        "nodes_per_verify": round(sum(r.k_drafted for r in verifies) / max(1, len(verifies)), 3),
                        "plain_s": round(plain_s, 4),
                        "seconds": round(seconds, 4),
                        "speedup": round(plain_s / seconds, 3),
                        "identical": tokens == plain,
                    }
                )
                print(" ".join(f"{key}={value}" for key, value in rows[-1].items()), flush=True)
    return rows


def _held(flags: list[bool]) -> str:
    """ "k/n": the runs of n whose flag held."""
    return f"{sum(map(bool, flags))}/{len(flags)}"


def tree_costs(args, budget: Budget, until: float) -> list[dict]:
    """Verify cost by node count on the controlled shapes (fast; exact up to 8 nodes)."""
    rows = []
    for name in args.models:
        model, _ = load(f"synthetic:{name}", layers=args.layers)
        for mode, nodes in (("fast", NODE_COUNTS), ("exact", (1, 2, 4, 8))):
            if budget.over(f"{name} {mode} tree costs", until=until):
                continue
            left = until - time.perf_counter()
            costs = measure_tree_costs(model, nodes=nodes, verify=mode, repeats=5, budget_s=left / 2)
            table = costs.to_polars().with_columns(pl.lit(name).alias("shape"), pl.lit(args.layers).alias("layers"))
            print(table, flush=True)
            rows.extend(table.to_dicts())
        del model
        mx.clear_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "reports/gpu-trees"))
    parser.add_argument("--budget", type=float, default=300.0, help="seconds; no new work starts after them")
    parser.add_argument("--quick", action="store_true", help="CPU smoke run on tiny shapes")
    parser.add_argument("--models", default="qwen3-8b-4bit,qwen3-30b-a3b-4bit")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--acceptance", default="0.6,0.8")
    parser.add_argument("--path-k", type=int, default=4)
    parser.add_argument("--branches", type=int, default=3)
    parser.add_argument("--tree-depth", type=int, default=4)
    parser.add_argument("--trace-model", default="smollm2-135m")
    parser.add_argument("--trace-tokens", type=int, default=64)
    parser.add_argument("--suffix-budget", type=int, default=16)
    parser.add_argument("--mtp-prompts", default="natural_text,qa,summarization,math_reasoning")
    parser.add_argument("--mtp-tokens", type=int, default=64)
    parser.add_argument("--sim-budgets", default="4,8,16,32", help="node budgets the simulator compares")
    args = parser.parse_args()
    if args.quick:
        args.models, args.layers, args.prompts, args.prompt_len, args.tokens = "qwen3-8b-tiny", 2, 1, 24, 12
        args.acceptance, args.trace_tokens, args.trace_model = "0.8", 6, "tiny:smollm2-135m"
        args.mtp_prompts, args.mtp_tokens = "qa", 8
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.acceptance = [float(a) for a in args.acceptance.split(",")]
    args.sim_budgets = [int(b) for b in args.sim_budgets.split(",")]
    args.mtp_prompts = [c.strip() for c in args.mtp_prompts.split(",") if c.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    sim_rows, real_rows, auto, cost_rows = traces(args, budget, budget.until(0.4))
    write_csv_atomic(out / "traces_sim.csv", sim_rows)
    write_csv_atomic(out / "traces_real.csv", real_rows)
    mtp_rows = mtp_trees(args, budget, budget.until(0.55))
    write_csv_atomic(out / "mtp_trees.csv", mtp_rows)
    cost_rows += tree_costs(args, budget, budget.until(0.75))
    write_csv_atomic(out / "tree_costs.csv", cost_rows)
    rows = controlled(args, budget)
    write_csv_atomic(out / "controlled.csv", rows)
    summary = {
        "device": device_name(),
        "args": {k: v for k, v in vars(args).items()},
        "total_s": round(budget.elapsed(), 1),
        "skipped": budget.skipped_lines(),
        # "k/n": how many runs of n held (an empty "all" would read true over zero runs)
        "controlled_identical_exact": _held([r["identical"] for r in rows if r["verify"] == "exact"]),
        "traces_identical": _held([r["identical"] for r in real_rows]),
        "simulator_agrees": _held([r["simulator_agrees"] for r in real_rows]),
        "mtp_identical": _held([r["identical"] for r in mtp_rows]),
        "auto_node_budget": auto,
    }
    write_result(out / "summary.json", summary)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
