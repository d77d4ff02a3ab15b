"""Reference profiles shipped with the package: converted faithfully from the H200's results, and usable as
profiles (c(w), a*(k), c(w, B)) on any machine."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from specbench import cost
from specbench.cost.reference import REFERENCE_DIR, available, reference_profiles

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "reports" / "gpu-h200"


def converter():
    spec = importlib.util.spec_from_file_location("reference_profiles", ROOT / "scripts" / "reference_profiles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not SOURCE.is_dir(), reason="the H200's report folder is not in this checkout")
def test_the_shipped_file_is_the_conversion_of_the_h200_results():
    shipped = json.loads((REFERENCE_DIR / "h200.json").read_text())
    assert shipped == json.loads(json.dumps(converter().convert(SOURCE)))  # nothing edited or re-measured by hand
    measured = {p["name"]: p for p in json.loads((SOURCE / "cost-grid-dense-moe" / "profiles.json").read_text())}
    reference = reference_profiles()
    for kind, name in (("dense", "synthetic:qwen3-8b-4bit"), ("MoE", "synthetic:qwen3-30b-a3b-4bit")):
        profile = reference.profile(kind)
        assert profile.name == name and profile.costs == measured[name]["costs"]
        assert profile.device == reference.device == "gpu:NVIDIA H200"


def test_the_reference_holds_dense_and_moe_costs_with_their_device_and_versions():
    assert "h200" in available()
    reference = reference_profiles("h200")
    assert reference.versions["mlx"] and reference.versions["mlx_lm"] and reference.measured[:4].isdigit()
    assert reference.describe().startswith("NVIDIA H200 reference (mlx ")
    dense, moe = reference.profile("dense"), reference.profile("MoE")
    for p in (dense, moe):
        assert set(p.costs) == {"fast", "exact"} and p.widths["fast"][0] == 1
        a_star = cost.break_even_acceptance(p, 0.0, 4, "fast")
        assert len(a_star) == 4 and np.nanmin(a_star) < 1
    # c(w, B) of both models, and distinct experts per block for the MoE
    assert set(reference.batch) == {dense.name, moe.name}
    for batch in reference.batch.values():
        assert batch.batch_sizes[0] == 1 and batch.batch_sizes[-1] >= 16
        assert batch.costs[1][0] == 1.0 and len(batch.curve(4)) >= 4
    assert reference.batch[moe.name].experts and all(e["distinct_experts"] >= 8 for e in reference.experts)
    assert {r["name"] for r in reference.grid} == {dense.name, moe.name}
    with pytest.raises(KeyError, match="no hybrid profile"):
        reference.profile("hybrid")
    with pytest.raises(FileNotFoundError, match="shipped: h200"):
        reference_profiles("nowhere")
