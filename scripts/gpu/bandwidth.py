"""Memory bandwidth achieved by plain decoding, against the device's measured peak.

    python3 -m scripts.gpu.bandwidth --budget 90   # H200: SmolLM2-135M, Qwen3-8B and Qwen3-30B-A3B shapes (4-bit, bf16)
    python3 -m scripts.gpu.bandwidth --quick       # CPU: tiny float32 shapes, seconds

For each model: the weight bytes one decode step reads (``specbench.cost.bandwidth.bytes_per_forward``:
every weight once, of routed experts only the share a token uses), the plain decode speed through
specbench's engine (and mlx-lm's ``stream_generate`` for reference), and their product against the
peak: the fastest of the passes over a large array that ``specbench.cost.bandwidth.peak_passes`` times
(``PEAK_METHOD``), each printed. Writes bandwidth.csv and
bandwidth.json into $OUT (or --out, default reports/gpu-bandwidth) and prints a table. Models that would
not fit in --budget seconds are skipped.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step

from scripts.gpu.budget import Budget
from specbench.common.files import write_csv_atomic
from specbench.common.identity import device_name, versions, write_result
from specbench.core.engine import plain_generation
from specbench.core.options import GenerateOptions
from specbench.cost.bandwidth import PEAK_METHOD, Bandwidth, bytes_per_forward, peak_passes
from specbench.cost.timing import seconds_per_token
from specbench.models.load import load

FULL = ["smollm2-135m", "synthetic:qwen3-8b-4bit", "synthetic:qwen3-8b-bf16", "synthetic:qwen3-30b-a3b-4bit"]
QUICK = ["synthetic:qwen3-8b-tiny", "synthetic:qwen3-30b-a3b-tiny"]


def _mlx_lm_tokens_per_s(model, prompt: list[int], tokens: int) -> float:
    """mlx-lm's own decode speed (``generate_step``) on the same prompt, the prompt pass excluded."""
    return 1.0 / seconds_per_token(int(token) for token, _ in generate_step(mx.array(prompt), model, max_tokens=tokens))


def measure(name: str, tokens: int, rounds: int, peak: float) -> dict:
    start = time.perf_counter()
    model, _ = load(name)
    prompt = list(range(1, 33))
    options = GenerateOptions(max_tokens=tokens, ignore_eos=True)
    seconds_per_token(plain_generation(model, prompt, GenerateOptions(max_tokens=8, ignore_eos=True)))  # warm-up
    best = min(seconds_per_token(plain_generation(model, prompt, options)) for _ in range(rounds))
    engine = Bandwidth(1.0 / best, bytes_per_forward(model), peak)
    reference = _mlx_lm_tokens_per_s(model, prompt, tokens)
    row = {
        "model": name,
        "bytes_per_token": engine.bytes_per_token,
        "specbench_tokens_per_s": round(engine.tokens_per_s, 2),
        "mlx_lm_tokens_per_s": round(reference, 2),
        "achieved_gb_s": round(engine.bytes_per_s / 1e9, 2),
        "peak_gb_s": round(peak / 1e9, 1),
        "fraction_of_peak": round(engine.fraction, 3),
        "bandwidth_limit_tokens_per_s": round(engine.limit_tokens_per_s, 1),
        "seconds": round(time.perf_counter() - start, 1),
    }
    print(f"{name}: {engine.describe()}; mlx-lm {reference:.1f} tok/s ({row['seconds']:.0f} s)", flush=True)
    del model
    gc.collect()
    mx.clear_cache()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes on the CPU, seconds")
    parser.add_argument("--models", default=None, help="comma list of models (default: per mode)")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per timed generation")
    parser.add_argument(
        "--budget", type=float, default=90.0, help="seconds (default 90); models that would not fit are skipped"
    )
    parser.add_argument("--out", default=os.environ.get("OUT") or "reports/gpu-bandwidth", help="output folder")
    args = parser.parse_args()
    budget = Budget(args.budget)
    models = args.models.split(",") if args.models else (QUICK if args.quick else FULL)
    tokens = args.tokens or (16 if args.quick else 128)
    rounds = 2 if args.quick else 3
    passes = peak_passes()
    peak = max(passes.values())
    for method, value in passes.items():
        print(f"{device_name()}: {method} pass {value / 1e9:.1f} GB/s", flush=True)
    print(f"{device_name()}: measured peak {peak / 1e9:.1f} GB/s ({PEAK_METHOD})", flush=True)
    rows = []
    for name in models:
        longest = max((r["seconds"] for r in rows), default=0.0)  # the next model may be as slow as the slowest
        if budget.fits(name, longest):
            rows.append(measure(name, tokens, rounds, peak))
    out = Path(args.out)
    write_csv_atomic(out / "bandwidth.csv", rows)
    write_result(
        out / "bandwidth.json",
        {
            "device": device_name(),
            **versions(),
            "peak_method": PEAK_METHOD,
            "peak_passes_bytes_per_s": passes,
            "peak_bytes_per_s": peak,
            "rows": rows,
            "skipped": budget.skipped_names(),
        },
    )
    print(f"\n{'model':34s} {'MB/token':>9s} {'tok/s':>8s} {'mlx-lm':>8s} {'GB/s':>7s} {'of peak':>8s}")
    for r in rows:
        print(
            f"{r['model']:34s} {r['bytes_per_token'] / 1e6:9.0f} {r['specbench_tokens_per_s']:8.1f} "
            f"{r['mlx_lm_tokens_per_s']:8.1f} {r['achieved_gb_s']:7.2f} {r['fraction_of_peak']:8.0%}"
        )
    if budget.skipped:
        print(f"skipped (budget): {', '.join(budget.skipped_names())}")
    print(f"results: {out} ({budget.elapsed():.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
