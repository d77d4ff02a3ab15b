"""The row-invariant quantized matmul per layer: its schedules against MLX's products, in time, bandwidth and bits.

    python3 -m scripts.gpu.kernels             # H200: every layer shape, 1 and 9 rows (about 2 minutes)
    python3 -m scripts.gpu.kernels --survey    # also the probe survey of every configuration and variant
    python3 -m scripts.gpu.kernels --quick     # two small shapes, few calls (on a CPU: MLX's products only)

Per layer of the dense Qwen3-8B and MoE Qwen3-30B-A3B shapes (4-bit, group 64, bfloat16), for 1 and --rows
rows: microseconds and GB/s (and share of the measured peak) of MLX's one-row product, MLX's fast w-row
product, MLX's row-invariant 7 + 2-row calls, and ``qmv_rows`` in each launch of
``scripts.gpu.kernel_bench.KERNEL_LAUNCHES`` (today's ``loop`` schedule and ``prefetch``, each with 8 and
with 2 warps per block); each figure also with the calls' graphs built before the clock (``eval``: launches and
device time only); and whether each launch's rows at 1 and w rows are bit-identical to MLX's one-row
products. The dequant variant is the device probe's (``qmv_variant``, stored after its first run). The A/A arm:
MLX's one-row product of the first layer timed against itself in 6 pairs of alternating order (``AACheck``);
a run whose A/A fails is reported as failed ("A/A failed" printed, and under "a_a" in the file).

Writes qmv_schedules.json into $OUT (or --out) and prints one table.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import mlx.core as mx

from scripts.gpu.kernel_bench import KERNEL_LAUNCHES, bench_qmv, probe_kernels
from scripts.result_lines import AACheck
from specbench.bench.paired import MIN_UNITS
from specbench.common.identity import device_name, versions, write_result
from specbench.cost.bandwidth import peak_passes
from specbench.kernels import cuda_available, qmv_variant

#: (name, N, K): the 4-bit linear layers of the dense Qwen3-8B and MoE Qwen3-30B-A3B shapes.
SHAPES = [
    ("8b q/o", 4096, 4096),
    ("8b k/v", 1024, 4096),
    ("8b gate/up", 12288, 4096),
    ("8b down", 4096, 12288),
    ("8b lm head", 151936, 4096),
    ("30b-a3b q", 4096, 2048),
    ("30b-a3b k/v", 512, 2048),
    ("30b-a3b o", 2048, 4096),
]
#: --quick (a smoke run): a small layer, and one whose K ends in a partial pass (576 = 512 + 64).
QUICK_SHAPES = [("small", 256, 1024), ("residue", 128, 576)]


def say(text: str) -> None:
    print(text, flush=True)


WIDTH = 21


def cell(row: dict, name: str) -> str:
    """``name``'s microseconds (graph built inside / outside the clock) and GB/s, or n/a where not timed."""
    if f"{name}_us" not in row:
        return f"{'n/a':>{WIDTH}s}"
    return f"{row[f'{name}_us']:7.1f}/{row[f'{name}_eval_us']:6.1f} {row[f'{name}_gbs']:6.0f}"


def header(labels: list[str]) -> str:
    heads = ["mlx (1 row; fast at w)", "mlx invariant 7+2", *[f"kernel {label}" for label in labels]]
    return f"{'layer':12s} {'rows':>4s}  " + "  ".join(f"{h:>{WIDTH}s}" for h in heads)


def show(layer: str, row: dict, labels: list[str]) -> None:
    """One line per row count: MLX's product, MLX's invariant calls, each kernel launch; then bit-identity."""
    w = row["rows"]
    for m in (1, w):
        names = ["mlx_1", "-"] if m == 1 else [f"mlx_fast_{w}", f"mlx_invariant_{w}"]
        names += [f"kernel_{label}_{m}" for label in labels]
        say(f"{layer:12s} {m:4d}  " + "  ".join(cell(row, name) for name in names))
    if labels:
        identical = {label: row[f"identical_{label}"] for label in labels}
        say(f"{'':12s}       bit-identical to MLX's one-row products: {identical}")


def aa_check(n: int, k: int, rows: int, calls: int, repeats: int) -> AACheck:
    """The A/A arm: MLX's one-row product of an N x K layer (``bench_qmv``'s "mlx_1") timed against itself in
    ``MIN_UNITS`` adjacent pairs, the order alternating, so its ratio shows the machine's own noise."""
    ratios = []
    for pair in range(MIN_UNITS):
        first, second = (
            bench_qmv(n, k, rows=rows, calls=calls, repeats=repeats, launches=None)["mlx_1_us"] for _ in range(2)
        )
        ratios.append(first / second if pair % 2 == 0 else second / first)
    return AACheck.of_ratios(ratios)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two small shapes, 2 calls x 2 repeats")
    parser.add_argument("--rows", type=int, default=9, help="the verify width timed beside 1 row (default 9)")
    parser.add_argument("--survey", action="store_true", help="also run the probe survey (probe_kernels)")
    parser.add_argument("--out", default=os.environ.get("OUT") or "reports/gpu-kernels", help="output folder")
    args = parser.parse_args()
    start = time.perf_counter()
    on_cuda = cuda_available()
    shapes, calls, repeats = (QUICK_SHAPES, 2, 2) if args.quick else (SHAPES, 32, 7)
    say(f"device {device_name()}  mlx {mx.__version__}  CUDA kernels: {on_cuda}")
    result: dict = {"device": device_name(), **versions(), "rows": args.rows, "quick": args.quick}
    if args.survey:
        result["probe"] = probe_kernels(progress=lambda r: say(f"  probe {r}"))
    peak = max(peak_passes().values()) / 1e9
    t0 = time.perf_counter()
    dequant = qmv_variant(mx.bfloat16, 4, 64) if on_cuda else None
    probe_s = time.perf_counter() - t0  # about 0 where an earlier process stored the verdict
    result |= {"peak_gb_s": peak, "dequant": dequant, "probe_s": probe_s}
    result["launches"] = KERNEL_LAUNCHES if dequant else {}
    labels = list(KERNEL_LAUNCHES) if dequant else []
    say(f"measured peak {peak:.0f} GB/s; dequant variant {dequant} (probe or stored verdict: {probe_s:.1f} s)")
    if on_cuda and dequant is None:
        say("the probe found no exact qmv_rows variant: MLX's products only")
    say("\neach cell: us per call with the graph built inside / outside the clock, and GB/s")
    say(header(labels))
    result["layers"] = []
    for layer, n, k in shapes:
        row = bench_qmv(
            n,
            k,
            rows=args.rows,
            dequant=dequant or "mul-add",
            peak_gbs=peak,
            calls=calls,
            repeats=repeats,
            launches=KERNEL_LAUNCHES if dequant else None,
        )
        result["layers"].append({"layer": layer} | row)
        show(layer, row, labels)
        write_result(Path(args.out) / "qmv_schedules.json", result)
    if labels:
        say("\nkernel / MLX per call (graph built inside the clock):")
        for r in result["layers"]:
            w = r["rows"]
            ratios = "  ".join(
                f"{label}: 1 row {r[f'kernel_{label}_1_us'] / r['mlx_1_us']:.2f}, "
                f"{w} rows {r[f'kernel_{label}_{w}_us'] / r[f'mlx_fast_{w}_us']:.2f}"
                for label in labels
            )
            say(f"  {r['layer']:12s} {ratios}")
    _, n, k = shapes[0]
    a_a = aa_check(n, k, args.rows, calls, repeats)
    result["a_a"] = a_a.as_record()
    write_result(Path(args.out) / "qmv_schedules.json", result)
    say(f"A/A {a_a.verdict()} (MLX one row, {shapes[0][0]})" + ("" if a_a.passed else ": reported as failed"))
    say(f"results: {Path(args.out) / 'qmv_schedules.json'} ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
