"""Run on 2 local ring ranks by tests/distributed/test_calibration_ranks.py: exact calibration spread over the ranks
(``calibrate_over_ranks``), each rank with a store of its own (as on two machines); what each rank calibrated
itself and what it then holds go to ``OUT/calibrationR.json``."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":
    root = Path(sys.argv[1])
    rank = os.environ.get("MLX_RANK", "0")
    (root / f"started{rank}").write_text("")
    os.environ["SPECBENCH_HOME"] = str(root / f"home{rank}")

    from specbench.exact.calibration import calibrate_over_ranks, load_calibration
    from specbench.models.load import load

    model, _ = load("synthetic:qwen3-8b-tiny")
    said: list[str] = []
    calibrate_over_ranks(model, [2, 3, 4, 5], [32, 255], said.append)
    held = load_calibration(model)
    stored = json.loads(next((root / f"home{rank}" / "exact").glob("*.json")).read_text())
    result = {
        "calibrated_here": sum(line.startswith("exact calibration ") for line in said),
        "held": {str(w): c.lengths for w, c in sorted(held.widths.items())},
        "stored": sorted(int(w) for w in stored["widths"]),
    }
    (root / f"calibration{rank}.json").write_text(json.dumps(result))
