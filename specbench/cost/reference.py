"""Reference profiles measured on another device, shipped with the package: what a dense and an MoE model's
verifications cost on an accelerator, to set beside this machine's.

``reference_profiles()`` reads ``specbench/assets/reference/h200.json``, converted (not re-measured) from the H200
results by ``scripts/reference_profiles.py``: c(w), c(w, B), experts per block, the measured grid and the stacks
by component of the Qwen3-8B, Qwen3-30B-A3B and Qwen3.5-9B shapes (4-bit, random weights).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from specbench.common.files import ASSETS_DIR
from specbench.cost.batch import BatchProfile
from specbench.cost.profile import Profile, check_profile

REFERENCE_DIR = ASSETS_DIR / "reference"


@dataclass(frozen=True)
class Reference:
    """One device's shipped profiles. ``label`` names it in figures and verdicts ("NVIDIA H200 reference");
    ``kinds``: model name -> "dense" or "MoE"; ``experts``: distinct experts per MoE layer of a block of w tokens
    (mean over layers) with the uniform-routing expectation; ``grid``: measured speedups per (name, mode, a, k)
    with the profile's prediction; ``batch``: c(w, B) per model name; ``components``: the verify-cost stack by
    component per model name (``specbench.cost.components.measure_components`` rows)."""

    device: str
    versions: dict[str, str]
    label: str
    measured: str
    sources: dict[str, str]
    kinds: dict[str, str]
    profiles: tuple[Profile, ...]
    batch: dict[str, BatchProfile]
    experts: tuple[dict[str, Any], ...]
    grid: tuple[dict[str, Any], ...]
    components: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def profile(self, kind: str) -> Profile:
        """The profile of the model of ``kind`` ("dense" or "MoE")."""
        for p in self.profiles:
            if self.kinds.get(p.name) == kind:
                return p
        raise KeyError(f"the {self.label} has no {kind} profile (it has {', '.join(self.kinds.values())})")

    def describe(self) -> str:
        """Where and with what it was measured, in one line: "NVIDIA H200 reference (mlx 0.32.4, mlx-lm 0.32.2,
        measured 2026-11-30)"."""
        return (
            f"{self.label} (mlx {self.versions.get('mlx', '?')}, mlx-lm {self.versions.get('mlx_lm', '?')}, "
            f"measured {self.measured})"
        )


def available() -> list[str]:
    """The names of the shipped references (``h200``)."""
    return sorted(p.stem for p in REFERENCE_DIR.glob("*.json"))


@functools.cache
def reference_profiles(name: str = "h200") -> Reference:
    """The shipped reference ``name`` (see ``available()``)."""
    path = REFERENCE_DIR / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no reference profiles named {name!r} (shipped: {', '.join(available()) or 'none'})")
    data = json.loads(path.read_text(encoding="utf-8"))
    try:
        profiles = tuple(check_profile(p) for p in data.pop("profiles"))
    except ValueError as err:
        raise ValueError(f"the shipped reference {path} is damaged ({err})") from err
    costs = [_BatchCost(**r) for r in data.pop("batch_costs")]
    batch = _batch_profiles(costs, data.pop("batch_experts", []), data.get("device"))
    components: dict[str, list[dict[str, Any]]] = {}
    for row in data.pop("components", []):
        components.setdefault(row.get("name"), []).append(row)
    experts, grid = tuple(data.pop("experts", [])), tuple(data.pop("grid", []))
    return Reference(**data, profiles=profiles, batch=batch, experts=experts, grid=grid, components=components)


@dataclass(frozen=True)
class _BatchCost:
    """One stored c(w, B): a model's [B, w] verification over its [B, 1] plain step."""

    model: str
    batch_size: int
    width: int
    c: float
    seconds: float
    plain_step_s: float


def _batch_profiles(rows: list[_BatchCost], experts: list[dict[str, Any]], device: str) -> dict[str, BatchProfile]:
    """c(w, B) per model, in first-seen order."""
    out: dict[str, BatchProfile] = {}
    for model in dict.fromkeys(r.model for r in rows):
        costs: dict[int, list[float]] = {}
        plain_s: dict[int, float] = {}
        for r in sorted((r for r in rows if r.model == model), key=lambda r: (r.batch_size, r.width)):
            costs.setdefault(int(r.batch_size), []).append(float(r.c))
            plain_s[int(r.batch_size)] = float(r.plain_step_s)
        blocks = [e for e in experts if e.get("model") == model]
        out[model] = BatchProfile(model, device, 256, costs, plain_s, blocks)
    return out
