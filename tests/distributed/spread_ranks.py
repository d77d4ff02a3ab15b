"""Run by ``mlx.launch -n 2 --backend ring`` (tests/distributed/test_spread_ranks.py): ``specbench report`` and
``specbench bench`` spread over the ranks, into ``OUT/report`` and ``OUT/bench``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import prompt_bench_ranks  # noqa: E402
import report_ranks  # noqa: E402

if __name__ == "__main__":
    root = Path(sys.argv[1])
    (root / f"started{os.environ.get('MLX_RANK', '0')}").write_text("")
    report_ranks.run_on_ranks(root / "report")
    prompt_bench_ranks.run_on_ranks(root / "bench")
