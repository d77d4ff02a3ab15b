"""Per-call seconds of an MLX computation, as the kernels' timings take them (``scripts/gpu/kernel_bench.py``
times the kernels against MLX's own products with it)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import mlx.core as mx


def per_call_seconds(call: Callable[[], mx.array], calls: int = 32, repeats: int = 7, built: bool = False) -> float:
    """Median seconds of one call, each evaluation running ``calls`` independent calls; ``built``: the calls'
    graphs are built before the clock starts, so only their evaluation is timed (launches and device time,
    without the Python that builds them)."""
    mx.eval(call())
    times = []
    for _ in range(repeats):
        mx.synchronize()
        outputs = [call() for _ in range(calls)] if built else None
        t0 = time.perf_counter()
        mx.eval(outputs if built else [call() for _ in range(calls)])
        mx.synchronize()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)
