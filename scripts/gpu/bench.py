"""Spec-Bench-protocol prompt benchmark on the device, and the engine's speed against mlx-lm.

    python3 -m scripts.gpu.bench            # H200: the embedded SmolLM2-135M, bundled prompts, < 5 minutes
    python3 -m scripts.gpu.bench --quick    # CPU smoke run: two short prompts, 8 tokens, prompt lookup only
    python3 -m scripts.gpu.bench --render reports/gpu   # redraw table and figure from saved results (no model)

1. Engine speed (``scripts.bench_engine``): specbench plain ``generate`` over mlx-lm ``stream_generate``
   tokens/s, and the step log's share of generation time, in one run; with its A/A arm (mlx-lm against itself,
   at least 6 alternating rounds, ``result_lines.AACheck``): a run whose A/A fails is reported as failed ("A/A failed"
   printed, and under "a_a" in engine_speed.json).
2. ``specbench.bench.bench_prompts`` on the bundled prompts (--limit per category): mlx-lm plain,
   specbench plain, and prompt lookup, SuffixDecoding and MTP (when the model has a head) under each
   policy; greedy, batch 1, every output checked against mlx-lm's plain output. Questions that would
   not start within --budget seconds are skipped (and counted in the table).

Writes into $OUT (default reports/gpu): prompt_bench_runs.parquet (one row per timed run),
prompt_bench_summary.parquet and .csv (per method and category), prompt_bench.json (settings),
prompt_bench.md (the table), prompt_bench_speedup.png (speedup by category; skipped where matplotlib
is missing: draw it later with --render), engine_speed.json; prints the table.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from pathlib import Path

from scripts.gpu.budget import Budget

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: 2 short prompts, 8 tokens, lookup only")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drafters", default="lookup,suffix,mtp", help="mtp is skipped when the model has no head")
    parser.add_argument("--policies", default="auto,fixed:4")
    parser.add_argument("--verify", default=None, help="comma list of exact, fast (default: the engine's, exact)")
    parser.add_argument("--categories", default=None)
    parser.add_argument("--limit", type=int, default=3, help="questions per category")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--engine-tokens", type=int, default=128, help="tokens per run of the engine speed check")
    parser.add_argument("--engine-rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=270.0, help="seconds for the whole script")
    parser.add_argument("--render", default=None, help="only redraw table and figure of the results in this folder")
    args = parser.parse_args()
    if args.render:
        from specbench.bench.prompt_bench import load_prompt_bench
        from specbench.report.figures.bench import save_prompt_figure

        result = load_prompt_bench(args.render)
        paths = result.save(args.render)
        figure = save_prompt_figure(result, args.render)
        print(result.table())
        print(f"\nwrote {paths['table']} and {figure}")
        return
    if args.quick:
        args.drafters, args.policies, args.categories, args.limit = "lookup", "fixed:4", "qa,natural_text", 1
        args.max_tokens, args.engine_tokens, args.engine_rounds = 8, 8, 1
    out = Path(os.environ.get("OUT") or "reports/gpu")
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)

    from specbench import load
    from specbench.bench.prompt_bench import PROMPT_SUMMARY_FILE, bench_prompts
    from specbench.common.files import write_csv_atomic
    from specbench.common.identity import device_name, versions, write_result
    from specbench.core.policies import DraftPolicy
    from specbench.drafters import make_drafter
    from specbench.inputs.prompts import bundled_questions, render_prompt

    model, tokenizer = load(args.model)
    load_s = budget.elapsed()
    print(f"{args.model} loaded in {load_s:.1f} s on {device_name()}", flush=True)

    # 1. engine speed, before anything else has warmed the model up differently
    from scripts import bench_engine as eng

    prompt = render_prompt(tokenizer, eng.PROMPT)
    eng.run_mlx_lm(model, tokenizer, prompt, 8)
    eng.run_specbench(model, tokenizer, prompt, 8)
    speed = eng.speed_ratio(model, tokenizer, prompt, args.engine_tokens, args.engine_rounds)
    a_a = eng.aa_check(model, tokenizer, prompt, args.engine_tokens, args.engine_rounds)
    logging = eng.logging_overhead(model, tokenizer, prompt, args.engine_tokens, max(2, args.engine_rounds // 2), False)
    engine = {"model": args.model, "device": device_name(), **versions(), "speed": speed, "a_a": a_a.as_record()}
    engine |= {"logging_plain": logging}
    write_result(out / "engine_speed.json", engine)
    print(
        f"engine: specbench/mlx-lm decode tokens/s {speed['decode_ratio']['median']:.3f} "
        f"({speed['decode_ratio']['min']:.3f}-{speed['decode_ratio']['max']:.3f}), end to end "
        f"{speed['e2e_ratio']['median']:.3f}; mlx-lm {speed['decode_tokens_per_s']['mlx-lm']:.1f} tok/s; "
        f"outputs equal {speed['equal_outputs']}; logging {100 * logging['overhead_fraction']['median']:.3f}% "
        f"({logging['per_record_us']:.1f} us/record, {logging['step_ms']:.2f} ms/step)",
        flush=True,
    )
    print(f"A/A {a_a.verdict()} (engine: mlx-lm against itself)" + ("" if a_a.passed else ": reported as failed"))

    # 2. the prompt benchmark
    drafters, notes = [], []
    for name in [d.strip() for d in args.drafters.split(",") if d.strip()]:
        try:
            make_drafter(name, model=model, model_name=args.model)
            drafters.append(name)
        except (ValueError, FileNotFoundError) as err:
            notes.append(f"{name}: skipped ({err})")
    for note in notes:
        print(note, flush=True)
    categories = [c.strip() for c in args.categories.split(",")] if args.categories else None
    questions = bundled_questions(categories, args.limit)
    verify = [v.strip() for v in args.verify.split(",")] if args.verify else [None]
    remaining = budget.left() - 25.0  # saving and the figure
    result = bench_prompts(
        model,
        tokenizer,
        questions,
        drafters=drafters,
        policies=[DraftPolicy.parse(p) for p in args.policies.split(",") if p.strip()],
        max_tokens=args.max_tokens,
        repeats=args.repeats,
        verify=verify,
        model_name=args.model,
        out=out,
        fresh=True,
        time_budget_s=remaining,
    )
    if importlib.util.find_spec("matplotlib") is not None and result.runs:
        from specbench.report.figures.bench import save_prompt_figure

        save_prompt_figure(result, out)
    summary = result.summary()
    write_csv_atomic((out / PROMPT_SUMMARY_FILE).with_suffix(".csv"), summary)
    print()
    print(result.table())
    for note in notes:
        print(note)
    print(f"\ntotal {budget.elapsed():.1f} s; results in {out}")


if __name__ == "__main__":
    main()
