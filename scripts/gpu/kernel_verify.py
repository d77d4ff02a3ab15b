"""Exact verification with the row-invariant kernel, on a model at full depth: exactness and cost.

    python3 -m scripts.gpu.kernel_verify                      # H200: Qwen3-8B shape, 4-bit, full depth
    python3 -m scripts.gpu.kernel_verify --shape qwen3-30b-a3b --width 9
    python3 -m scripts.gpu.kernel_verify --quick              # CPU smoke run: a tiny float32 shape

1. calibration at --width (specbench.exact.calibrate: every level tested bit for bit against
   serial steps at a short cache and across the KV buffer's step), with ``linear/kernel`` among the
   levels where the device's probe proves the kernel: which levels were exact and what each cost;
2. cost: a width-w verify forward at a cache of --offset tokens, median of --repeats synchronous
   forwards, at the batched (fast) level, the calibrated exact level and the best exact level
   without the kernel; and a plain one-token step; ratios measured in this run; with the A/A arm: the fast
   level's cost timed against itself in 6 pairs of alternating order (``result_lines.AACheck``): a run whose A/A
   fails is reported as failed ("A/A failed" printed, and under "a_a" in the file);
3. with --levels, where the difference goes: each named level (exact or not) timed the same way, and
   also with its graph built before the clock (device time and launches only), so that host time
   (building the graph: the hooks, the kernel calls' set-up) and device time are told apart.
   --no-calibrate skips 1-2 and times --levels only;
4. with --widths (e.g. 1-9,12,16) instead: per width, the fast and the calibrated exact forward at --offset cached
   tokens, their cost in plain steps (c(w): over the width-1 fast forward, a plain step), and how far each is from
   the memory bound: the weight bytes the forward reads (``specbench.cost.bandwidth.bytes_per_forward``: every
   weight once, the experts its rows are expected to touch) over its seconds, against the device's measured peak
   (``peak_bandwidth``), and fast mode's cost (``FastVerifier``: the exact level where calibration timed it cheaper
   than the batched forward); written to kernel_widths-SHAPE-BITSbit.json.

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
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache

from scripts.result_lines import AACheck
from specbench.bench.paired import MIN_UNITS
from specbench.common.identity import device_name, versions, write_result
from specbench.cost.bandwidth import bytes_per_forward, peak_bandwidth
from specbench.exact import calibrate
from specbench.exact.hooks import split_mode
from specbench.models import synthetic


def forward_seconds(model, level: str, width: int, offset: int, repeats: int, graph_outside: bool = False) -> float:
    """Median seconds of a width-``width`` forward at ``level`` after ``offset`` cached tokens; with
    ``graph_outside``, the graph is built before the clock starts (device time and launches only)."""

    def prefilled() -> list:
        cache = make_prompt_cache(model)
        model(mx.arange(offset)[None] % 1000, cache=cache)
        mx.eval([c.state for c in cache])
        return cache

    cache = prefilled()
    trimmable = can_trim_prompt_cache(cache)  # a recurrent layer's cache is not: such a model prefills each time
    tokens = (mx.arange(width)[None] + 7) % 1000
    times = []
    for _ in range(repeats + 2):
        cache = cache if trimmable else prefilled()
        with split_mode(model, level):
            mx.synchronize()
            t0 = time.perf_counter()
            out = model(tokens, cache=cache)
            if graph_outside:
                mx.synchronize()
                t0 = time.perf_counter()
            mx.eval(out)
            times.append(time.perf_counter() - t0)
        if trimmable:
            trim_prompt_cache(cache, width)
    return statistics.median(times[2:])


def aa_check(model, width: int, offset: int, repeats: int) -> AACheck:
    """The A/A arm: the fast level's width-``width`` forward (``forward_seconds``) timed against itself in
    ``MIN_UNITS`` adjacent pairs, the order alternating, so its ratio shows the machine's own noise."""
    ratios = []
    for pair in range(MIN_UNITS):
        first, second = (forward_seconds(model, "none", width, offset, repeats) for _ in range(2))
        ratios.append(first / second if pair % 2 == 0 else second / first)
    return AACheck.of_ratios(ratios)


def level_breakdown(model, levels: list[str], width: int, offset: int, repeats: int) -> dict[str, dict[str, float]]:
    """Per level: whole forward and eval-only (graph built before the clock) milliseconds, and their
    difference (host time spent building the graph)."""
    out = {}
    print(f"\nper level, width {width} at {offset} cached tokens (median of {repeats}):")
    print(f"  {'level':42s} {'whole ms':>9s} {'eval ms':>9s} {'host ms':>9s}")
    for level in levels:
        whole = forward_seconds(model, level, width, offset, repeats)
        device = forward_seconds(model, level, width, offset, repeats, graph_outside=True)
        out[level] = {"whole_ms": whole * 1e3, "eval_ms": device * 1e3, "host_ms": (whole - device) * 1e3}
        print(f"  {level:42s} {whole * 1e3:9.2f} {device * 1e3:9.2f} {(whole - device) * 1e3:9.2f}", flush=True)
    return out


def width_profile(model, widths: list[int], offset: int, repeats: int) -> list[dict]:
    """Per width: fast and calibrated exact forward milliseconds, c(w) of each over the width-1 fast forward, and
    the weight bytes per second each achieves against the device's measured peak."""
    calibration = calibrate(model, [w for w in widths if w > 1], save=False)
    peak = peak_bandwidth()
    plain = forward_seconds(model, "none", 1, offset, repeats)
    print(f"\nper width at {offset} cached tokens (median of {repeats}); peak {peak / 1e9:.0f} GB/s:")
    head = ("w", 3), ("fast ms", 8), ("c fast", 7), ("exact ms", 9), ("c exact", 8), ("GB/s", 6), ("peak", 5)
    print(" ".join(f"{name:>{size}s}" for name, size in head) + "  level")
    rows = []
    for width in widths:
        level = "none" if width == 1 else calibration.level_for(width)
        fast_level = "none" if width == 1 else calibration.widths[width].fast_level
        fast = plain if width == 1 else forward_seconds(model, "none", width, offset, repeats)
        exact = fast if level == "none" else forward_seconds(model, level, width, offset, repeats)
        nbytes = bytes_per_forward(model, width)
        row = {
            "width": width,
            "level": level,
            "fast_ms": fast * 1e3,
            "exact_ms": exact * 1e3,
            "c_fast": fast / plain,
            "c_exact": exact / plain,
            "fast_mode_level": fast_level,  # fast mode's pick (FastVerifier): the exact level where calibration timed
            "c_fast_mode": (exact if fast_level != "none" else fast) / plain,  # it cheaper than the batched forward
            "bytes": nbytes,
            "fast_peak_fraction": nbytes / fast / peak,
            "exact_peak_fraction": nbytes / exact / peak,
        }
        rows.append(row)
        print(
            f"  {width:3d} {row['fast_ms']:8.2f} {row['c_fast']:7.2f} {row['exact_ms']:9.2f} {row['c_exact']:8.2f} "
            f"{nbytes / exact / 1e9:6.0f} {row['exact_peak_fraction']:5.0%}  {level}; "
            f"fast mode {row['c_fast_mode']:.2f}" + (" (exact level)" if fast_level != "none" else ""),
            flush=True,
        )
    return rows


def widths_of(text: str) -> list[int]:
    """The widths of a list of widths and ranges: "1-9,12,16" gives 1 to 9, 12 and 16."""
    widths: set[int] = set()
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        widths.update(range(int(low), int(high or low) + 1))
    return sorted(widths)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-8b")
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--layers", type=int, default=None, help="default: full depth")
    parser.add_argument("--width", type=int, default=9)
    parser.add_argument("--offset", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--levels", default="", help="comma list of levels to time whole and eval-only")
    parser.add_argument("--no-calibrate", action="store_true", help="time --levels only")
    parser.add_argument("--widths", default="", help="per-width profile instead (e.g. 1-9,12,16): see 4. above")
    parser.add_argument("--quick", action="store_true", help="CPU smoke run: a tiny float32 shape, 2 layers")
    parser.add_argument("--out", default=os.environ.get("OUT") or "reports/gpu-kernels")
    args = parser.parse_args()
    if args.quick:
        args.shape, args.bits, args.layers, args.width, args.offset, args.repeats = "qwen3-8b-tiny", 0, 2, 5, 32, 3
    start = time.perf_counter()
    model = synthetic.build(args.shape, layers=args.layers, bits=args.bits)
    print(
        f"device {device_name()}  {args.shape} {args.bits}-bit  built in {time.perf_counter() - start:.0f} s",
        flush=True,
    )
    if args.widths:
        rows = width_profile(model, widths_of(args.widths), args.offset, args.repeats)
        write_result(
            Path(args.out) / f"kernel_widths-{args.shape}-{args.bits}bit.json",
            {"device": device_name(), **versions(), **vars(args), "peak_bytes_per_s": peak_bandwidth(), "widths": rows},
        )
        print(f"({time.perf_counter() - start:.0f} s)")
        return 0
    levels = [level for level in args.levels.split(",") if level]
    if args.no_calibrate:
        breakdown = level_breakdown(model, levels, args.width, args.offset, args.repeats)
        write_result(
            Path(args.out) / f"kernel_levels-{args.shape}-{args.bits}bit.json",
            {"device": device_name(), **versions(), **vars(args), "levels": breakdown},
        )
        print(f"({time.perf_counter() - start:.0f} s)")
        return 0
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
    a_a = aa_check(model, args.width, args.offset, args.repeats)
    print(f"  A/A {a_a.verdict()} (fast against fast)" + ("" if a_a.passed else ": reported as failed"))
    breakdown = level_breakdown(model, levels, args.width, args.offset, args.repeats) if levels else {}
    write_result(
        Path(args.out) / f"kernel_verify-{args.shape}-{args.bits}bit.json",
        {"device": device_name(), **versions(), **vars(args), "chosen": chosen, "without_kernel": without}
        | {"tests": tests, "seconds": costs, "a_a": a_a.as_record(), "levels": breakdown},
    )
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
