"""Token trees against paths on the device: speedups at controlled acceptance and on the traces.

    python3 scripts/gpu/trees.py            # H200, about 5 minutes (--budget 300)
    python3 scripts/gpu/trees.py --quick    # CPU smoke run: tiny shapes, a few tokens, under a minute

1. Controlled acceptance (``synthetic:`` dense qwen3-8b-4bit and MoE qwen3-30b-a3b-4bit shapes at
   --layers depth): the model's plain greedy continuation drafted as a path of --path-k tokens (each
   position kept with probability a) or as a tree of --branches such drafts (independent
   corruptions, merged where they agree) of --tree-depth tokens each; plain, path and tree decoding of
   --prompts random prompts x --tokens tokens in exact and fast verify mode: wall time, tokens per
   verification, speedup over plain, output identical to plain.
2. Traces (the embedded SmolLM2-135M): the model's greedy outputs (--trace-tokens per turn) on every
   turn of data/traces (recorded history as prompts); the simulator replays SuffixDecoding and prompt
   lookup as paths and as trees (``specbench.experiments.trees``); then real runs of SuffixDecoding
   path and tree (exact and fast) on the same prompts: wall time, speedup, and whether the real
   run's steps equal the simulator's.

Writes into $OUT (or --out; default reports/gpu-trees): controlled.csv, traces_sim.csv, traces_real.csv,
summary.json; prints the tables. Stops starting new work once --budget seconds are spent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mlx.core as mx
import numpy as np

from specbench.common.files import write_csv_atomic, write_json_atomic
from specbench.common.identity import device_name
from specbench.core.draft import Draft, Drafter
from specbench.core.engine import Generation, generate
from specbench.core.forward import vocab_size
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.core.tree import breadth_first_tree
from specbench.drafters import SuffixDecoding
from specbench.drafters.oracle import OracleDrafter
from specbench.exact import ExactVerifier, verifier_for
from specbench.experiments.simulate import Recorded, simulate, trace_groups
from specbench.experiments.traces import TRACES_DIR, bundled_traces, read_trace_file
from specbench.experiments.trees import compare_trees, record_groups, tree_gain
from specbench.models.load import load


class OracleTree(Drafter):
    """``branches`` controlled-acceptance drafts of the same continuation (independent corruptions),
    merged into one tree level by level."""

    name = "oracle-tree"

    def __init__(self, oracles: list[OracleDrafter], depth: int):
        self.oracles, self.depth = oracles, depth

    def begin(self, prompt, hidden=None):
        for o in self.oracles:
            o.begin(prompt)

    def observe(self, tokens, hidden=None):
        for o in self.oracles:
            o.observe(tokens)

    def draft(self, context, k):
        paths = [o.draft(context, min(self.depth, k)).tokens for o in self.oracles]
        tokens, parents = breadth_first_tree([p for p in paths if p], k)
        return Draft(tokens, parents=parents)


def timed(make, model, prompt, options, verifier=None, drafter=None, k=0, tokenizer=None):
    """(tokens, seconds, log stats) of one generation (stopping at the tokenizer's EOS when one is given)."""
    mx.synchronize()
    t0 = time.perf_counter()
    if drafter is None:
        gen = generate(model, prompt, options, tokenizer=tokenizer)
    else:
        gen = Generation(
            model, prompt, options, drafter=drafter, policy=DraftPolicy.fixed(k), verifier=verifier, tokenizer=tokenizer
        )
    tokens = list(gen)
    mx.synchronize()
    return tokens, time.perf_counter() - t0, gen.log.stats(), gen


def verifiers_of(model, quick: bool, widths: int) -> dict:
    """Exact (calibrated up front for widths 2..``widths`` on the device; one fixed exact level in a
    quick CPU run) and fast."""
    exact = ExactVerifier(model, level="attention") if quick else ExactVerifier(model, widths=range(2, widths + 1))
    return {"exact": exact, "fast": verifier_for(model, "fast")}


def controlled(args, deadline: float) -> list[dict]:
    rows = []
    for name in args.models:
        if time.perf_counter() > deadline:
            print(f"skipped {name}: budget spent", flush=True)
            continue
        model, _ = load(f"synthetic:{name}", layers=args.layers)
        vocab = vocab_size(model)
        rng = np.random.default_rng(0)
        prompts = [rng.integers(0, vocab, args.prompt_len).tolist() for _ in range(args.prompts)]
        options = GenerateOptions(max_tokens=args.tokens)
        verifiers = verifiers_of(model, args.quick, max(args.path_k, args.branches * args.tree_depth) + 1)
        # Warm-up: kernels of every width, exact calibration.
        warm = prompts[0][: args.prompt_len // 2]
        for v in verifiers.values():
            oracle = OracleDrafter.from_model(model, warm, 16, 0.7)
            timed(None, model, warm, GenerateOptions(max_tokens=16), v, oracle, args.path_k)
        for prompt in prompts:
            if time.perf_counter() > deadline:
                break
            runs = [timed(None, model, prompt, options) for _ in range(2)]  # the faster of two plain runs
            plain, plain_s = runs[0][0], min(r[1] for r in runs)
            recorded = OracleDrafter.from_model(model, prompt, args.tokens + 16, 1.0).recorded
            for a in args.acceptance:
                for mode, verifier in verifiers.items():
                    for shape in ("path", "tree"):
                        if shape == "path":
                            drafter, k = OracleDrafter(prompt, recorded, a, vocab, seed=1), args.path_k
                        else:
                            oracles = [
                                OracleDrafter(prompt, recorded, a, vocab, seed=1 + b) for b in range(args.branches)
                            ]
                            drafter, k = OracleTree(oracles, args.tree_depth), args.branches * args.tree_depth
                        tokens, seconds, stats, _ = timed(None, model, prompt, options, verifier, drafter, k)
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


def traces(args, deadline: float) -> tuple[list[dict], list[dict]]:
    model, tokenizer = load(args.trace_model)
    runs = [t for name in bundled_traces() for t in read_trace_file(TRACES_DIR / f"{name}.jsonl")]
    groups, _ = trace_groups(runs, tokenizer)
    if args.quick:
        groups = [(trace, lambda g=g: list(g())[:2]) for trace, g in groups[:2]]
    t0 = time.perf_counter()
    recorded = record_groups(model, tokenizer, groups, args.trace_tokens)
    print(f"recorded {len(recorded)} turns in {time.perf_counter() - t0:.1f} s", flush=True)
    table = compare_trees(recorded, budgets=[args.suffix_budget])
    gain = tree_gain(table)
    print(gain, flush=True)
    real_rows = []
    verifiers = verifiers_of(model, args.quick, args.suffix_budget + 1)
    by_trace: dict[str, list[Recorded]] = {}
    for r in recorded:
        by_trace.setdefault(r.id.rsplit("/", 1)[0], []).append(r)
    for trace, turns in by_trace.items():
        options = GenerateOptions(max_tokens=args.trace_tokens)
        plain_times = [timed(None, model, turn.prompt, options, tokenizer=tokenizer)[1] for turn in turns]
        for mode, verifier in verifiers.items():
            for tree in (False, True):
                if time.perf_counter() > deadline:
                    break
                drafter = SuffixDecoding(max_spec_tokens=args.suffix_budget, tree=tree)
                sim = SuffixDecoding(max_spec_tokens=args.suffix_budget, tree=tree)
                plain_s, spec_s = sum(plain_times), 0.0
                identical = agree = True
                verifies = accepted = 0
                for turn in turns:
                    out, s_s, stats, gen = timed(
                        None, model, turn.prompt, options, verifier, drafter, args.suffix_budget, tokenizer
                    )
                    log = simulate([turn], sim, DraftPolicy.fixed(args.suffix_budget), options)
                    keys = ("kind", "accepted", "accepted_path", "tokens")
                    agree &= [[r[k] for k in keys] for r in log] == [[r[k] for k in keys] for r in gen.log]
                    spec_s += s_s
                    identical &= out == turn.output
                    verifies += stats["verifies"]
                    accepted += stats["accepted"]
                real_rows.append(
                    {
                        "trace": trace,
                        "verify": mode,
                        "draft": "tree" if tree else "path",
                        "turns": len(turns),
                        "accepted_per_verify": round(accepted / verifies, 3) if verifies else 0.0,
                        "plain_s": round(plain_s, 3),
                        "seconds": round(spec_s, 3),
                        "speedup": round(plain_s / spec_s, 3) if spec_s else 0.0,
                        "identical": identical,
                        "simulator_agrees": agree,
                    }
                )
                print(" ".join(f"{key}={value}" for key, value in real_rows[-1].items()), flush=True)
    return table.to_dicts(), real_rows


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
    args = parser.parse_args()
    if args.quick:
        args.models, args.layers, args.prompts, args.prompt_len, args.tokens = "qwen3-8b-tiny", 2, 1, 24, 12
        args.acceptance, args.trace_tokens, args.trace_model = "0.8", 6, "tiny:smollm2-135m"
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.acceptance = [float(a) for a in args.acceptance.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    # Half the budget for the controlled runs, the rest for the traces.
    rows = controlled(args, start + args.budget / 2)
    write_csv_atomic(out / "controlled.csv", rows)
    sim_rows, real_rows = traces(args, start + args.budget)
    write_csv_atomic(out / "traces_sim.csv", sim_rows)
    write_csv_atomic(out / "traces_real.csv", real_rows)
    summary = {
        "device": device_name(),
        "args": {k: v for k, v in vars(args).items()},
        "total_s": round(time.perf_counter() - start, 1),
        "controlled_identical_exact": all(r["identical"] for r in rows if r["verify"] == "exact"),
        "traces_identical_exact": all(r["identical"] for r in real_rows if r["verify"] == "exact"),
        "simulator_agrees_exact": all(r["simulator_agrees"] for r in real_rows if r["verify"] == "exact"),
    }
    write_json_atomic(out / "summary.json", summary)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
