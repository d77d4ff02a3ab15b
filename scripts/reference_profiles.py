"""Convert the H200's measured cost results into the reference profiles specbench ships
(``specbench/assets/reference/h200.json``, read by ``specbench.cost.reference``). Nothing is measured here.

    python scripts/reference_profiles.py            # from reports/gpu-h200, into the package's assets

Sources (their commands: reports/gpu-h200/README.md):
- ``cost-grid-dense-moe/``: c(w) in fast and exact mode of the Qwen3-8B (dense) and Qwen3-30B-A3B (MoE) shapes,
  4-bit, full depth; distinct experts per block; the measured a x k grid with its predictions;
- ``batch/`` (the dense shape) and ``batch/moe-b32/`` (the MoE shape alone, B up to 32): c(w, B) and distinct
  experts per [B, w] block;
- ``components/stack-run5/``: the verify-cost stack by component of the dense and MoE shapes (one call) and the
  hybrid (Qwen3.5-9B) shape (a second call), with each forward's phases and each part's host work.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

from specbench.common.files import write_text_atomic
from specbench.common.identity import result_data

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports" / "gpu-h200"
OUT = ROOT / "specbench" / "assets" / "reference" / "h200.json"
DENSE, MOE = "synthetic:qwen3-8b-4bit", "synthetic:qwen3-30b-a3b-4bit"
GRID_COLUMNS = ("name", "mode", "a", "k", "speedup", "predicted_nominal", "error_nominal", "tokens")
STACK = Path("components") / "stack-run5"
STACK_FILES = ("components_dense_moe.json", "components_hybrid.json")
#: What a stack's figure and verdict read (``specbench.report``): the rest of a row is in the report folder.
STACK_COLUMNS = (
    "name", "device", "width", "part", "group", "seconds", "c", "step_s", "c_step", "plain_step_s", "error",
    "step_spread", "forward_s", "closure", "forward_build_s", "forward_dispatch_s", "forward_wait_s", "build_closure",
    "dispatch_closure", "wait_closure", "host_s",
)  # fmt: skip


def _rows(path: Path) -> list[dict[str, Any]]:
    """A CSV's rows with numbers parsed (ints where whole, else floats; other text kept)."""

    def value(text: str) -> Any:
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    with path.open(newline="") as f:
        return [{k: value(v) for k, v in row.items()} for row in csv.DictReader(f)]


def convert(reports: Path) -> dict[str, Any]:
    grid_dir, batch_dir = reports / "cost-grid-dense-moe", reports / "batch"
    profiles = result_data(json.loads((grid_dir / "profiles.json").read_text()))
    if sorted(p["name"] for p in profiles) != sorted([DENSE, MOE]):
        raise SystemExit(f"{grid_dir}/profiles.json: expected profiles of {DENSE} and {MOE}")
    devices = {p["device"] for p in profiles}
    versions = {json.dumps({k: v for k, v in p["versions"].items() if k != "specbench"}) for p in profiles}
    if len(devices) != 1 or len(versions) != 1:
        raise SystemExit(f"the profiles were measured on several devices or versions: {devices}, {versions}")
    batch = [r for r in _rows(batch_dir / "batch_costs.csv") if r["model"] == DENSE]
    batch += [r for r in _rows(batch_dir / "moe-b32" / "batch_costs.csv") if r["model"] == MOE]
    return {
        "device": devices.pop(),
        "versions": json.loads(versions.pop()),
        "label": "NVIDIA H200 reference",
        "measured": min(p["created"] for p in profiles)[:10],
        "sources": {
            "profiles": "reports/gpu-h200/cost-grid-dense-moe (scripts/gpu/cost.py, cuDNN attention off)",
            "batch": "reports/gpu-h200/batch (dense) and batch/moe-b32 (MoE) (scripts/gpu/batch.py)",
            "components": f"reports/gpu-h200/{STACK.as_posix()} (scripts/gpu/components.py --phases components)",
        },
        "kinds": {DENSE: "dense", MOE: "MoE"},
        "profiles": profiles,
        "experts": _rows(grid_dir / "experts.csv"),
        "grid": [{k: r[k] for k in GRID_COLUMNS} for r in _rows(grid_dir / "grid.csv")],
        "batch_costs": batch,
        "batch_experts": [r for r in _rows(batch_dir / "moe-b32" / "batch_experts.csv") if r["model"] == MOE],
        # host_s (the parts counted by phase) only from runs that measured it
        "components": [
            {k: r[k] for k in STACK_COLUMNS if k in r}
            for name in STACK_FILES
            for r in result_data(json.loads((reports / STACK / name).read_text()))
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=Path, default=REPORTS, help="the H200's report folder")
    parser.add_argument("--out", type=Path, default=OUT, help="the JSON file to write")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(convert(args.reports), indent=1) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
