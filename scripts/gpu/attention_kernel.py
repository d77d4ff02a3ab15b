"""The row-invariant attention kernel on this device: does every row equal MLX's one-query attention, and what it costs.

    python3 -m scripts.gpu.attention_kernel            # from the repository root; H200: well under 90 s
    python3 -m scripts.gpu.attention_kernel --quick    # bfloat16, head dimension 128 only

1. probe: for bfloat16 / head dimension 128 (every variant) and, unless --quick, bfloat16 / 64 and
   float16 / 128 (the first exact variant), whether each row of ``attention_rows`` over causal blocks of
   1, 2, 9 and 16 rows after cache prefixes of 20, 300, 1016 (crossing the two-pass threshold) and 2500
   keys equals MLX's one-query ``scaled_dot_product_attention`` over the keys that row attends;
2. speed at the Qwen3-8B shape (32 heads, 8 KV heads, head dimension 128, bfloat16), 9 rows, at 256,
   2048 and 8192 keys: per call, the kernel (4 and 8 (row, head) pairs per warp) against the 9
   one-query MLX calls exact mode runs without it and MLX's 9-query causal call (not row-invariant),
   and 1 row of each (``scripts.gpu.kernel_bench.bench_attention``).

Writes attention_kernel.json into $OUT (or --out) and prints both tables.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import mlx.core as mx

from scripts.gpu.kernel_bench import bench_attention, probe_attention
from specbench.common.identity import device_name, versions, write_result
from specbench.kernels import attention_variant
from specbench.kernels.attention import VARIANTS

KEY_LENGTHS = (256, 2048, 8192)
ROWS = 9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="probe bfloat16 / head dimension 128 only")
    parser.add_argument("--out", default=os.environ.get("OUT") or "reports/gpu-kernels", help="output folder")
    args = parser.parse_args()
    start = time.perf_counter()
    print(f"device {device_name()}  mlx {mx.__version__}", flush=True)
    print(f"\n{'dtype':9s} {'D':>4s} {'variant':>8s}  exact")

    def show(r: dict) -> None:
        detail = r.get("error") or (r["mismatches"][:1] if r.get("mismatches") else "")
        print(f"{r['dtype']:9s} {r['head_dim']:4d} {r['variant']:>8s}  {r['exact']}  {detail}", flush=True)

    probe = probe_attention(configs=((mx.bfloat16, 128),), variants=VARIANTS, progress=show)
    if not args.quick:
        for dtype, head_dim in ((mx.bfloat16, 64), (mx.float16, 128)):
            chosen = attention_variant(dtype, head_dim)  # every row count 1..16, variants in order
            row = {"kernel": "attention_rows", "dtype": str(dtype).split(".")[-1], "head_dim": head_dim}
            probe.append(row | {"variant": chosen or "none", "exact": chosen is not None, "rows": "1..16"})
            show(probe[-1])
    variant = next((r["variant"] for r in probe if r["exact"] and r["head_dim"] == 128), None)
    print(f"\nprobe {time.perf_counter() - start:.0f} s; timing variant {variant}", flush=True)
    speed = []
    if variant is None:
        print("no variant is bit-identical here: the kernel would not be used, so it is not timed")
    for n_keys in KEY_LENGTHS if variant is not None else ():
        for per_warp in (4, 8):
            row = bench_attention(n_keys, rows=ROWS, variant=variant, vectors_per_warp=per_warp)
            speed.append(row)
            w = ROWS
            print(
                f"{n_keys:5d} keys, {per_warp} per warp: kernel {w} {row[f'kernel_{w}_us']:7.1f} us  "
                f"{w} one-query MLX {row[f'mlx_split_{w}_us']:7.1f}  MLX {w}-query {row[f'mlx_{w}_us']:7.1f}  |  "
                f"kernel 1 {row['kernel_1_us']:6.1f}  MLX 1 {row['mlx_1_us']:6.1f}  |  "
                f"split/kernel {row[f'mlx_split_{w}_us'] / row[f'kernel_{w}_us']:.2f}x  "
                f"kernel/MLX {w}-query {row[f'kernel_{w}_us'] / row[f'mlx_{w}_us']:.2f}x  "
                f"({row[f'kernel_{w}_gbs']:.0f} GB/s of K/V)",
                flush=True,
            )
    out = Path(args.out)
    write_result(
        out / "attention_kernel.json",
        {"device": device_name(), **versions(), "variant": variant, "probe": probe, "speed": speed},
    )
    print(f"results: {out / 'attention_kernel.json'} ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
