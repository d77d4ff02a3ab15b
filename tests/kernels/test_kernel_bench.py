"""The kernel benchmark's bookkeeping, with a stand-in for the CUDA kernel: each launch is timed at 1 and w rows
and checked bit for bit against MLX's one-row products (the GPU runs the real kernel: scripts/gpu/kernels.py)."""

from __future__ import annotations

import mlx.core as mx

from scripts.gpu import kernel_bench as bench
from specbench.kernels import qmv_rows_reference


def test_each_launch_is_timed_and_checked_against_mlx_one_row_products(monkeypatch):
    launched = []

    def stand_in(x, w, scales, biases, group_size, bits, dequant, schedule, per_block):
        launched.append((schedule, per_block))
        if schedule == "loop":  # MLX's one-row products: bit-identical by construction
            rows = [mx.quantized_matmul(x[i : i + 1], w, scales, biases, True, group_size, bits) for i in range(len(x))]
            return mx.concatenate(rows)
        return qmv_rows_reference(x, w, scales, biases, group_size, bits)  # close, not equal

    monkeypatch.setattr(bench, "qmv_rows", stand_in)
    launches = {"loop": ("loop", 8), "prefetch/2": ("prefetch", 2)}
    row = bench.bench_qmv(32, 576, rows=3, dtype=mx.float16, peak_gbs=100.0, calls=1, repeats=1, launches=launches)
    assert row["identical_loop"] is True and row["identical_prefetch/2"] is False
    assert set(launched) == {("loop", 8), ("prefetch", 2)}
    for name in ("mlx_1", "mlx_fast_3", "mlx_invariant_3", "kernel_loop_1", "kernel_loop_3", "kernel_prefetch/2_3"):
        for suffix in ("", "_eval"):
            assert row[f"{name}{suffix}_us"] > 0 and row[f"{name}{suffix}_gbs"] > 0
            assert row[f"{name}{suffix}_of_peak"] == row[f"{name}{suffix}_gbs"] / 100.0


def test_without_launches_only_mlx_products_are_timed():
    row = bench.bench_qmv(32, 512, rows=2, dtype=mx.float16, calls=1, repeats=1, launches=None)
    assert not any(key.startswith(("kernel_", "identical_")) for key in row)
    assert row["mlx_fast_2_us"] > 0 and row["mlx_1_eval_us"] > 0
