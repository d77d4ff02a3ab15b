"""Exact output against mlx-lm's greedy decoding at long prompts, on the GPU.

    python3 -m scripts.gpu.long_context              # Qwen3-8B and Qwen3-30B-A3B shapes, 4-bit, full depth
    python3 -m scripts.gpu.long_context --quick      # CPU smoke run, tiny float32 shapes

Calibration probes its levels at short caches (32 and 255 keys); a generation runs at whatever length its prompt
has. For each shape and prompt length (4k, 16k and 32k random tokens by default): mlx-lm's greedy decoding of
--tokens tokens, then specbench's speculative decoding in exact and in fast mode with drafts of --k tokens from a
drafter that follows the greedy continuation at acceptance --acceptance (``specbench.checks.exactness``). Exact
output must equal mlx-lm's; fast output may not. Each length's rows are written as they finish (long_context.json
in $OUT, default reports/gpu, naming the commit, versions and device), with "exact_equal" and "fast_equal": "k/n",
k of the mode's n rows equal to mlx-lm's; --budget stops before a length that would not fit. A length that runs out
of device memory (mlx-lm's reference included) is listed under "unchecked" with its error, the run goes on, and the
exit status is 1, as for an exact row that differs. Each row keeps its peak device memory; --prefill-step chunks the
prompt of mlx-lm's reference and of specbench's generations alike (both default to 2048 tokens), for prompts whose
prefill attention would not fit at the default.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from scripts.gpu.budget import Budget
from specbench.bench.turn_cache import first_divergence
from specbench.checks.exactness import mlx_lm_greedy, oracle_generation
from specbench.common.identity import write_result
from specbench.core.forward import vocab_size
from specbench.core.options import GenerateOptions
from specbench.exact import AuditResult
from specbench.models import synthetic


def check_length(
    model,
    length: int,
    tokens: int,
    k: int,
    acceptance: float,
    seed: int,
    audit: float,
    prefill_step_size: int,
) -> list[dict]:
    """mlx-lm's greedy decoding after a random prompt of ``length`` tokens, then exact and fast speculative decoding."""
    prompt = np.random.default_rng(seed).integers(0, vocab_size(model), size=length).tolist()
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    reference = mlx_lm_greedy(model, prompt, tokens, prefill_step_size)
    seconds = round(time.perf_counter() - t0, 2)
    rows = [{"length": length, "mode": "mlx-lm", "seconds": seconds, "peak_mb": peak_mb()}]
    for mode in ("exact", "fast"):
        mx.reset_peak_memory()
        t0 = time.perf_counter()
        rate = audit if mode == "exact" else 0.0
        generation = oracle_generation(
            model,
            prompt,
            reference,
            tokens,
            k,
            mode,
            acceptance,
            seed=seed,
            audit=rate,
            prefill_step_size=prefill_step_size,
        )
        output = list(generation)
        stats = generation.stats()
        result = stats.get("exact_audit")
        rows.append(
            {
                "length": length,
                "mode": mode,
                "equal": output == reference,
                "first_divergence": first_divergence(output, reference),
                "verifies": stats["verifies"],
                "accepted": stats["accepted"],
                "seconds": round(time.perf_counter() - t0, 2),
                "peak_mb": peak_mb(),
                **({} if result is None else {"audit": audit_record(result)}),
            }
        )
    return rows


def peak_mb() -> float:
    """The device memory's peak since the last reset, in MB (weights included), beside each row's seconds."""
    return round(mx.get_peak_memory() / 1e6, 1)


def audit_record(result: AuditResult) -> dict:
    """What the audit of one exact generation found: verifications compared with serial steps, mismatches, the
    first diverging operation (None when every audited verification was bit-identical)."""
    return {
        "rate": result.rate,
        "verifications": result.verifications,
        "audited": result.audited,
        "mismatches": result.mismatches,
        "divergence": None if result.divergence is None else str(result.divergence),
        "summary": result.summary(),
    }


def equal_counts(rows: list[dict]) -> dict[str, str]:
    """The summary of ``rows``: per verify mode, "k/n", k of its n rows equal to mlx-lm's greedy output."""
    counts = {}
    for mode in ("exact", "fast"):
        equal = [r["equal"] for r in rows if r["mode"] == mode]
        counts[f"{mode}_equal"] = f"{sum(equal)}/{len(equal)}"
    audits = [r["audit"] for r in rows if "audit" in r]
    if audits:  # the audit's totals over every exact row: verifications compared with serial steps, mismatches
        audited, mismatches = sum(a["audited"] for a in audits), sum(a["mismatches"] for a in audits)
        counts["audit"] = f"{mismatches} mismatches in {audited} audited verifications"
        counts["audit_mismatches"] = f"{mismatches}/{audited}"
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--shapes", default="qwen3-8b-4bit,qwen3-30b-a3b-4bit", help="synthetic shapes, comma-separated")
    add("--lengths", default="4096,16384,32768", help="prompt lengths in tokens, comma-separated")
    add("--tokens", type=int, default=32, help="tokens generated after each prompt")
    add("--k", type=int, default=4, help="draft length")
    add("--acceptance", type=float, default=0.8, help="the drafter's per-position acceptance")
    add("--audit", type=float, default=0.0, help="share of exact verifications compared with serial steps (0 to 1)")
    add(
        "--prefill-step",
        type=int,
        default=GenerateOptions.prefill_step_size,
        help="prompt chunk of both mlx-lm's and specbench's prefill",
    )
    add("--budget", type=float, default=480.0, help="seconds: no length is started that would not fit")
    add("--quick", action="store_true", help="CPU smoke run: tiny shapes, short prompts")
    add("--out", default=os.environ.get("OUT", "reports/gpu"), help="output folder")
    args = parser.parse_args()
    shapes = ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny"] if args.quick else args.shapes.split(",")
    lengths = [300, 600] if args.quick else [int(n) for n in args.lengths.split(",")]
    tokens = 6 if args.quick else args.tokens
    if args.quick:
        mx.set_default_device(mx.cpu)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    report: dict = {
        "config": vars(args) | {"shapes": shapes, "lengths": lengths, "tokens": tokens},
        "rows": [],
        "unchecked": [],
    }
    for shape in shapes:
        model = synthetic.build(shape)
        for i, length in enumerate(lengths):
            if report["rows"] and not budget.fits(f"[{shape} {length}]", 3.0 * report["rows"][-1]["seconds"]):
                continue
            try:
                rows = check_length(model, length, tokens, args.k, args.acceptance, i, args.audit, args.prefill_step)
            except RuntimeError as error:  # out of device memory (mlx-lm's reference included): kept, the run goes on
                if "out of memory" not in str(error):
                    raise
                report["unchecked"].append({"shape": shape, "length": length, "error": str(error)})
                print(f"{shape} {length} tokens: not checked, out of device memory ({error})", flush=True)
                write_result(out / "long_context.json", report)
                mx.clear_cache()
                continue
            report["rows"] += [{"shape": shape, **row} for row in rows]
            for row in rows[1:]:
                print(
                    f"{shape} {length} tokens, {row['mode']}: equal to mlx-lm {row['equal']} "
                    f"(first divergence {row['first_divergence']}; {row['verifies']} verifications, "
                    f"{row['accepted']} accepted; {row['seconds']} s, peak {row['peak_mb'] / 1000:.1f} GB)"
                    + (f"; audit: {row['audit']['summary']}" if "audit" in row else ""),
                    flush=True,
                )
            report |= equal_counts(report["rows"])
            write_result(out / "long_context.json", report)
        del model
    print(f"exact output equal to mlx-lm's greedy: {report.get('exact_equal', '0/0')}", flush=True)
    print(f"fast output equal to mlx-lm's greedy: {report.get('fast_equal', '0/0')}", flush=True)
    if "audit" in report:
        print(f"audit of exact verifications: {report['audit']}", flush=True)
    for row in report["unchecked"]:
        print(f"not checked: {row['shape']} at {row['length']} tokens (out of device memory)", flush=True)
    return 0 if all(r["equal"] for r in report["rows"] if r["mode"] == "exact") and not report["unchecked"] else 1


if __name__ == "__main__":
    sys.exit(main())
