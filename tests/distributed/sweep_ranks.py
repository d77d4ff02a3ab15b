"""Run by ``mlx.launch -n 2 --backend ring`` (tests/distributed/test_sweep_ranks.py), and in a world of one
by the test itself: a small sweep over tiny-model cells, spread over the ranks, merged, saved in
``OUT/sweep/``; then the same sweep resumed after one finished cell's file was removed (``OUT/resumed/``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import build_tiny  # noqa: E402

from specbench.bench.sweep import run_sweep  # noqa: E402
from specbench.common import distributed  # noqa: E402

PROMPTS = [[5, 9, 13, 5, 9, 13, 5, 9], [7, 21, 7, 21, 40]]


def sweep(out: Path):
    """The sweep both runs make: 2 prompts x 2 temperatures = 4 cells, each plain + lookup fixed:2 and adaptive:3."""
    return run_sweep(
        build_tiny("qwen3", seed=5),
        None,
        PROMPTS,
        drafters=("lookup",),
        policies=("fixed:2", "adaptive:3"),
        max_tokens=8,
        temperatures=(0.0, 0.7),
        verify="fast",
        model_name="tiny-qwen3",
        progress=False,
        out=out,
    )


if __name__ == "__main__":
    out = Path(sys.argv[1])
    (out / f"started{os.environ.get('MLX_RANK', '0')}").write_text("")
    first = sweep(out / "cells")
    first.save(out / "sweep")
    if distributed.is_main():  # an interrupted sweep: one finished cell is gone
        next((out / "cells" / "cells").glob("*-runs.parquet")).unlink()
    distributed.barrier()
    sweep(out / "cells").save(out / "resumed")
