"""Trace replay on the device: plain decoding vs prompt lookup, SuffixDecoding and MTP (when the model has a
head) on every bundled trace, turn by turn, outputs checked identical.

    python3 -m scripts.gpu.traces            # H200: the embedded SmolLM2-135M, all bundled traces, < 4 minutes
    python3 -m scripts.gpu.traces --quick    # CPU smoke run: a tiny random model, 2 turns of each trace

Writes into $OUT (default reports/gpu): traces_summary.csv (one row per trace and method), traces_turns.csv
(one row per turn and method), traces_steps.parquet (every step's record, token lists dropped), traces.json
(settings, device, totals); prints the per-trace table.
Traces that would not start within --budget seconds are skipped (and listed).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import mlx.core as mx

from scripts.gpu.budget import Budget
from specbench import GenerateOptions
from specbench.bench.trace_bench import bench_trace, trace_methods
from specbench.bench.trace_summary import format_summary
from specbench.common.files import write_csv_atomic as write_csv
from specbench.common.identity import device_name, write_result
from specbench.core.policies import DraftPolicy
from specbench.inputs.importers import load_traces
from specbench.inputs.traces import bundled_traces


def tiny_model(vocab: int):
    """A random-weight two-layer llama over the tokenizer's vocabulary (CPU smoke runs)."""
    from mlx_lm.models import llama

    mx.random.seed(0)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=vocab,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    )
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: tiny random model, 2 turns per trace")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drafters", default="lookup,suffix,mtp")
    parser.add_argument("--policy", default="auto")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--traces", default=None, help="comma list of bundled trace names (default: all)")
    parser.add_argument("--verify", default=None, choices=["exact", "fast"])
    parser.add_argument("--budget", type=float, default=200.0, help="seconds after which no new trace starts")
    args = parser.parse_args()
    out = Path(os.environ.get("OUT") or "reports/gpu")
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)

    import polars as pl

    from specbench import load
    from specbench.models.load import ensure_embedded

    if args.quick:
        from mlx_lm.utils import load_tokenizer

        tokenizer = load_tokenizer(ensure_embedded("smollm2-135m"))
        model = tiny_model(len(tokenizer.vocab) if hasattr(tokenizer, "vocab") else 49152)
        args.turns, args.max_tokens, args.model = 2, 16, None
    else:
        model, tokenizer = load(args.model)
    load_s = budget.elapsed()

    policy = DraftPolicy.parse(args.policy)
    wanted = [d.strip() for d in args.drafters.split(",") if d.strip()]
    notes = []
    available = []
    for name in wanted:
        try:
            trace_methods([name], [policy], model, args.model)
            available.append(name)
        except (ValueError, FileNotFoundError) as err:
            notes.append(f"{name}: skipped ({err})")
    options = GenerateOptions(max_tokens=args.max_tokens, verify=args.verify)

    # Warm-up: compile kernels and measure the cost profile (the auto policy's break-even) before timing.
    warm = load_traces("chat-revision")[0]
    made, chosen = trace_methods(available, [policy], model, args.model)
    bench_trace(
        model, tokenizer, warm, made, chosen, options=GenerateOptions(max_tokens=8, verify=args.verify), turns=1
    )

    summaries, turn_rows, step_frames = [], [], []
    names = [t.strip() for t in args.traces.split(",")] if args.traces else bundled_traces()
    for name in names:
        if budget.over(name):
            continue
        (trace,) = load_traces(name)
        made, chosen = trace_methods(available, [policy], model, args.model)
        t0 = time.perf_counter()
        result = bench_trace(model, tokenizer, trace, made, chosen, options=options, turns=args.turns, progress=True)
        print(f"{name}: {time.perf_counter() - t0:.1f} s", flush=True)
        summaries.append(result.summary)
        turn_rows.extend(result.turns.to_dicts())
        step_frames.append(result.steps.to_polars().drop("tokens", "draft_tokens", "accept_probs", strict=False))
        pl.concat(step_frames, how="diagonal_relaxed").write_parquet(out / "traces_steps.parquet")
        write_csv(out / "traces_turns.csv", turn_rows)
        rows = [r for s in summaries for r in s.to_dicts()]
        write_csv(out / "traces_summary.csv", rows)

    summary = pl.concat(summaries, how="diagonal_relaxed") if summaries else None
    info = {
        "device": device_name(),
        "model": args.model or "tiny-random",
        "drafters": available,
        "policy": args.policy,
        "max_tokens": args.max_tokens,
        "turns": args.turns,
        "verify": args.verify,
        "load_s": round(load_s, 1),
        "total_s": round(budget.elapsed(), 1),
        "skipped_traces": budget.skipped_names(),
        "notes": notes,
        "identical": bool(summary["identical"].all()) if summary is not None else None,
    }
    write_result(out / "traces.json", info)
    print()
    print(
        f"device {info['device']}, model {info['model']}, policy {args.policy}, max_tokens {args.max_tokens}, "
        f"verify {args.verify or 'engine default'}"
    )
    if summary is not None:
        print(format_summary(summary))
    for note in notes:
        print(note)
    if budget.skipped:
        print(f"skipped (time budget): {', '.join(budget.skipped_names())}")
    print(f"total {info['total_s']} s; outputs identical: {info['identical']}")


if __name__ == "__main__":
    main()
