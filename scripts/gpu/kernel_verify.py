"""Exact verification with the row-invariant kernel, on a model at full depth: exactness and cost.

    python3 -m scripts.gpu.kernel_verify                      # H200: Qwen3-8B shape, 4-bit, full depth
    python3 -m scripts.gpu.kernel_verify --shape qwen3-30b-a3b --width 9

1. calibration at --width (specbench.exact.calibrate: every level tested bit for bit against
   serial steps at a short cache and across the KV buffer's step), with ``linear/kernel`` among the
   levels where the device's probe proves the kernel: which levels were exact and what each cost;
2. cost: a width-w verify forward at a cache of --offset tokens, median of --repeats synchronous
   forwards, at the batched (fast) level, the calibrated exact level and the best exact level
   without the kernel; and a plain one-token step; ratios measured in this run.

Writes kernel_verify.json into $OUT (or --out).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from specbench.common.files import write_json_atomic
from specbench.common.identity import device_name, versions
from specbench.exact import calibrate
from specbench.exact.hooks import split_mode
from specbench.models import synthetic


def forward_seconds(model, level: str, width: int, offset: int, repeats: int) -> float:
    """Median seconds of a width-``width`` forward at ``level`` after ``offset`` cached tokens."""
    cache = make_prompt_cache(model)
    model(mx.arange(offset)[None] % 1000, cache=cache)
    mx.eval([c.state for c in cache])
    tokens = (mx.arange(width)[None] + 7) % 1000
    times = []
    for _ in range(repeats + 2):
        with split_mode(model, level):
            mx.synchronize()
            t0 = time.perf_counter()
            mx.eval(model(tokens, cache=cache))
            times.append(time.perf_counter() - t0)
        for c in cache:
            c.trim(width)
    return statistics.median(times[2:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-8b")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--layers", type=int, default=None, help="default: full depth")
    parser.add_argument("--width", type=int, default=9)
    parser.add_argument("--offset", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default=os.environ.get("OUT") or "reports/gpu-kernels")
    args = parser.parse_args()
    start = time.perf_counter()
    model = synthetic.build(args.shape, layers=args.layers, bits=args.bits)
    print(
        f"device {device_name()}  {args.shape} {args.bits}-bit  built in {time.perf_counter() - start:.0f} s",
        flush=True,
    )
    t0 = time.perf_counter()
    calibration = calibrate(model, [args.width], save=False)
    chosen = calibration.level_for(args.width)
    tests = calibration.widths[args.width].tests
    print(f"calibration at width {args.width}: {chosen} ({time.perf_counter() - t0:.0f} s)")
    for t in tests:
        seconds = f"{t['seconds'] * 1e3:7.2f} ms" if t.get("seconds") else "       -  "
        print(f"  {t['level']:42s} exact {t['exact']!s:5s} {seconds} {t.get('error', '')}")
    no_kernel = [t for t in tests if t["exact"] and t.get("seconds") and "kernel" not in t["level"]]
    without = min(no_kernel, key=lambda t: t["seconds"])["level"] if no_kernel else "serial"
    costs = {
        "plain_step": forward_seconds(model, "none", 1, args.offset, args.repeats),
        "fast": forward_seconds(model, "none", args.width, args.offset, args.repeats),
        "exact": forward_seconds(model, chosen, args.width, args.offset, args.repeats),
        "exact_without_kernel": forward_seconds(model, without, args.width, args.offset, args.repeats),
    }
    print(f"\nwidth {args.width} at {args.offset} cached tokens (median of {args.repeats}):")
    for name, seconds in costs.items():
        print(f"  {name:22s} {seconds * 1e3:7.2f} ms  = {seconds / costs['plain_step']:.2f} plain steps")
    print(
        f"  exact ({chosen}) / fast = {costs['exact'] / costs['fast']:.2f};  "
        f"without the kernel ({without}) / fast = {costs['exact_without_kernel'] / costs['fast']:.2f}"
    )
    write_json_atomic(
        Path(args.out) / f"kernel_verify-{args.shape}-{args.bits}bit.json",
        {"device": device_name(), **versions(), **vars(args), "chosen": chosen, "without_kernel": without}
        | {"tests": tests, "seconds": costs},
    )
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
