"""Trace replay with and without each method's prompt cache kept across turns, on the device.

For every bundled trace, ``bench_trace`` runs twice: each method prefilling only the tokens a turn adds
(``reuse_cache``) and every turn prefilled in full. Recorded per turn and method: prompt tokens, tokens
served from the cache, prefill and decode seconds; checked: every drafter equals plain decoding, and the
plain outputs with the cache equal those without it, turn by turn (on a GPU a prefill split at another
token may round differently: this measures whether it does).

    python3 -m scripts.gpu.trace_cache            # H200: the embedded SmolLM2-135M, all bundled traces, ~3 minutes
    python3 -m scripts.gpu.trace_cache --quick    # CPU smoke run: a tiny random model, 2 turns of one trace

Writes into $OUT (default reports/gpu): trace_cache_turns.csv (one row per trace, turn, method and cache
setting), trace_cache.json (settings, device, totals, identical flags); prints one line per trace.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from scripts.gpu.budget import Budget
from specbench import GenerateOptions
from specbench.bench.trace_bench import bench_trace, trace_methods
from specbench.common.files import write_csv_atomic
from specbench.common.identity import device_name, write_result
from specbench.core.policies import DraftPolicy
from specbench.inputs.importers import load_traces
from specbench.inputs.traces import bundled_traces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: tiny random model, 2 turns of a trace")
    parser.add_argument("--out", default=None, help="results folder (default: $OUT, else reports/gpu)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drafters", default="lookup,suffix")
    parser.add_argument("--policy", default="fixed:4")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--turns", type=int, default=None)
    parser.add_argument("--budget", type=float, default=300.0, help="seconds after which no new trace starts")
    args = parser.parse_args()
    out = Path(args.out or os.environ.get("OUT") or "reports/gpu")
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)

    from specbench import load

    names = bundled_traces()
    if args.quick:
        from mlx_lm.utils import load_tokenizer

        from scripts.gpu.traces import tiny_model
        from specbench.models.load import ensure_embedded

        tokenizer = load_tokenizer(ensure_embedded("smollm2-135m"))
        model = tiny_model(len(tokenizer.vocab) if hasattr(tokenizer, "vocab") else 49152)
        args.turns, args.max_tokens, args.model, names = 2, 8, None, ["chat-revision"]
    else:
        model, tokenizer = load(args.model)
    policy = DraftPolicy.parse(args.policy)
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    options = GenerateOptions(max_tokens=args.max_tokens)
    # Warm-up: compile kernels before timing.
    warm = load_traces("chat-revision")[0]
    made, chosen = trace_methods(drafters, [policy], model, args.model)
    bench_trace(model, tokenizer, warm, made, chosen, options=GenerateOptions(max_tokens=8), turns=1)

    rows, traces = [], []
    for name in names:
        if budget.over(name):
            continue
        (trace,) = load_traces(name)
        runs = {}
        for reuse in (True, False):
            made, chosen = trace_methods(drafters, [policy], model, args.model)
            runs[reuse] = bench_trace(
                model, tokenizer, trace, made, chosen, options=options, turns=args.turns, reuse_cache=reuse
            )
            for r in runs[reuse].turns.to_dicts():
                rows.append({**{k: r[k] for k in KEEP}, "reuse_cache": reuse})
        same_plain = [a.output == b.output for a, b in zip(runs[True].recorded, runs[False].recorded)]
        prefill = {reuse: runs[reuse].turns["prefill_s"].sum() for reuse in runs}
        traces.append(
            {
                "trace": name,
                "turns": len(same_plain),
                "identical_with_cache": runs[True].identical,
                "identical_without_cache": runs[False].identical,
                "plain_same_with_and_without_cache": same_plain,
                "prefill_s_with_cache": round(prefill[True], 3),
                "prefill_s_without_cache": round(prefill[False], 3),
                "cached_prompt_tokens": int(runs[True].turns["cached_prompt_tokens"].sum()),
                "prompt_tokens": int(runs[True].turns["prompt_tokens"].sum()),
            }
        )
        print(
            f"{name}: prefill {prefill[True]:.2f} s with the cache vs {prefill[False]:.2f} s without; "
            f"drafters identical {runs[True].identical}/{runs[False].identical}; plain same with and without "
            f"the cache on {sum(same_plain)}/{len(same_plain)} turns",
            flush=True,
        )
        write_csv_atomic(out / "trace_cache_turns.csv", rows)
    info = {
        "device": device_name(),
        "model": args.model or "tiny-random",
        "drafters": drafters,
        "policy": args.policy,
        "max_tokens": args.max_tokens,
        "turns": args.turns,
        "traces": traces,
        "skipped_traces": budget.skipped_names(),
        "total_s": round(budget.elapsed(), 1),
    }
    write_result(out / "trace_cache.json", info)
    print(f"device {info['device']}, model {info['model']}, {info['total_s']} s; results in {out}")


KEEP = (
    "trace",
    "turn",
    "method",
    "prompt_tokens",
    "cached_prompt_tokens",
    "tokens",
    "prefill_s",
    "decode_s",
    "tokens_per_verify",
    "identical",
)


if __name__ == "__main__":
    main()
