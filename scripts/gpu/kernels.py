"""The row-invariant kernels on this device: does each reproduce MLX's one-row result, and what it costs.

    python3 -m scripts.gpu.kernels            # H200, about a minute
    python3 -m scripts.gpu.kernels --quick    # fewer shapes

1. probe: for bfloat16 and float16, 4 and 8 bits, group sizes 32/64/128 and each dequant variant,
   whether every row of ``qmv_rows`` over 1..16 rows equals MLX's quantized matmul of that row alone
   (``specbench.kernels.probe_kernels``);
2. speed: per-call microseconds and GB/s (against the measured peak) of MLX at 1 row, MLX at w rows
   (fast), MLX at w rows in row-invariant chunks of 7, and the kernel at 1 and w rows, for the linear
   layers of the Qwen3-8B and Qwen3-30B-A3B shapes, 4-bit (``specbench.kernels.bench.bench_qmv``).

Writes kernels.json into $OUT (or --out) and prints both tables.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import mlx.core as mx

from specbench.common.files import write_json_atomic
from specbench.common.identity import device_name, versions
from specbench.cost.bandwidth import peak_passes
from specbench.kernels import probe_kernels
from specbench.kernels.bench import bench_qmv

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the 8B q/o and gate/up shapes only")
    parser.add_argument("--rows", default="9", help="row counts to time (default 9,16)")
    parser.add_argument("--out", default=os.environ.get("OUT") or "reports/gpu-kernels", help="output folder")
    args = parser.parse_args()
    start = time.perf_counter()
    print(f"device {device_name()}  mlx {mx.__version__}", flush=True)
    print(f"\n{'kernel':9s} {'dtype':9s} {'bits':>4s} {'group':>5s} {'variant':>11s}  exact")

    def show(r: dict) -> None:
        detail = r.get("error") or (r["mismatches"][:1] if r.get("mismatches") else "")
        bits, group = r.get("bits", "-"), r.get("group_size", "-")
        print(
            f"{r['kernel']:9s} {r['dtype']:9s} {bits:>4} {group:>5} {r['variant']:>11s}  {r['exact']}  {detail}",
            flush=True,
        )

    probe = probe_kernels(progress=show)
    peak = max(peak_passes().values()) / 1e9
    print(f"\nmeasured peak {peak:.0f} GB/s ({time.perf_counter() - start:.0f} s so far)", flush=True)
    dequant = next((r["variant"] for r in probe if r["exact"] and r.get("bits") == 4), "mul-add")
    speed = []
    shapes = SHAPES[:1] + SHAPES[2:3] if args.quick else SHAPES
    for rows in [int(r) for r in args.rows.split(",")]:
        for name, n, k in shapes:
            row = {"layer": name, "dequant": dequant} | bench_qmv(n, k, rows=rows, dequant=dequant, peak_gbs=peak)
            speed.append(row)
            w = rows
            fast, one = row[f"kernel_{w}_us"] / row[f"mlx_fast_{w}_us"], row["mlx_1_us"] / row["kernel_1_us"]
            print(
                f"{name:12s} w={w:2d}  mlx 1 {row['mlx_1_us']:7.1f} us  kernel 1 {row['kernel_1_us']:7.1f}  "
                f"mlx fast {row[f'mlx_fast_{w}_us']:7.1f}  mlx invariant {row[f'mlx_invariant_{w}_us']:7.1f}  "
                f"kernel {row[f'kernel_{w}_us']:7.1f}  |  kernel/mlx fast {fast:.2f}  "
                f"mlx 1/kernel 1 {one:.2f}  kernel 1 {row['kernel_1_of_peak']:.0%} of peak",
                flush=True,
            )
    out = Path(args.out)
    write_json_atomic(
        out / "kernels.json", {"device": device_name(), **versions(), "peak_gb_s": peak, "probe": probe, "speed": speed}
    )
    print(f"results: {out} ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
