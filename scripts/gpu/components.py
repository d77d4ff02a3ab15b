"""Why speculation pays or not, on synthetic shapes: the verify-cost stack by component, c(w) and the
break-even along the context length, and batch predictions with their residuals.

    python3 -m scripts.gpu.components           # H200: Qwen3-8B, Qwen3-30B-A3B and Qwen3.5-9B shapes, 4-bit
    python3 -m scripts.gpu.components --quick   # CPU: tiny float32 shapes

Phases, each written to $OUT (default reports/gpu/components) as soon as it is done; a phase past --budget
seconds is skipped and named in summary.json:
1. components: per shape, a speculative step of width w split into attention, dense projections, MoE expert
   gathers, recurrent layers, output head, readback and the engine's drafting, acceptance, rollback, logging and
   host time (``specbench.cost.components``), with how far the parts' sum is from the measured step;
2. lengths: per shape, c(w) at several context lengths and the break-even acceptance a*(k) at each;
3. batch: dense and MoE, c(w, B), the engine's per-step and per-row overheads, and the controlled-acceptance
   batch grid with each cell's prediction and residual; the mean absolute error per shape and batch size.

Each shape also gets an A/A arm: its plain (one-token) forward timed against itself in 6 pairs of alternating order
(``scripts.gpu.kernel_verify.aa_check``), under "a_a" in summary.json: a shape whose A/A fails is reported as
failed (printed), its figures cannot be told from the machine's noise.

Writes components.json, lengths.json, batch.json and summary.json; prints compact tables. A batch grid too long for
one call is split by ``--grid-batch-sizes``, the later calls reading the first one's profiles (``--batch-profiles
batch.json``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from scripts.gpu.budget import Budget
from scripts.gpu.kernel_verify import aa_check
from specbench import cost
from specbench.common.identity import device_name, write_result
from specbench.core.experts import expert_layers
from specbench.cost.batch import BatchProfile, measure_batch_overhead, measure_batch_profile
from specbench.cost.components import PARTS, PHASES, deciding_part, measure_components, phase_reading
from specbench.cost.grid import batch_speedup_grid
from specbench.cost.predict import mean_absolute_error
from specbench.models import synthetic

FULL = {
    "shapes": ["qwen3-8b-4bit", "qwen3-30b-a3b-4bit", "qwen3.5-9b-4bit"],
    "batch_shapes": ["qwen3-8b-4bit", "qwen3-30b-a3b-4bit"],
    "component_widths": [1, 2, 4, 8, 16],
    "component_repeats": 5,
    "component_steps": 6,
    "offset": 512,
    "widths": [1, 2, 3, 5, 9, 16],
    "lengths": [2048, 8192, 32768],
    "repeats": 3,
    "batch_sizes": [1, 4, 16, 32],  # the grid's: c(w, B) measured where it is predicted, not interpolated
    "batch_widths": 5,
    "batch_offset": 256,
    "overhead_widths": [1, 3, 5],
    "grid_batch_sizes": [1, 4, 16, 32],
    "acceptances": [0.6, 0.9],
    "ks": [2, 4],
    "max_tokens": 48,
    "grid_repeats": 2,  # adjacent plain/speculative pairs per cell, medians
    "budget": 225.0,
}
QUICK = {
    "shapes": ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny", "qwen3.5-9b-tiny"],
    "batch_shapes": ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny"],
    "component_widths": [1, 3],
    "component_repeats": 2,
    "component_steps": 3,
    "offset": 32,
    "widths": [1, 2, 3],
    "lengths": [64, 128],
    "repeats": 1,
    "batch_sizes": [1, 2],
    "batch_widths": 3,
    "batch_offset": 8,
    "overhead_widths": [1, 3],
    "grid_batch_sizes": [1, 2],
    "acceptances": [0.9],
    "ks": [2],
    "max_tokens": 8,
    "grid_repeats": 1,
    "budget": 600.0,
}


class Run:
    """The phases over one set of shapes, each written out when done."""

    def __init__(self, cfg: dict[str, Any], out: Path, budget: Budget, batch_profiles: dict[str, Any] | None = None):
        self.cfg, self.out, self.budget = cfg, out, budget
        self.batch_profiles = batch_profiles or {}
        self.models: dict[str, Any] = {}
        self.summary: dict[str, Any] = {"device": device_name(), "skipped": [], "config": cfg}

    def left(self) -> float:
        return self.budget.left()

    def fits(self, what: str, need: float) -> bool:
        """Whether ``what`` fits the budget; if not it is named in summary.json's "skipped"."""
        if self.budget.fits(what, need):
            return True
        self.summary["skipped"] = self.budget.skipped_lines()
        return False

    def model(self, shape: str) -> Any:
        if shape not in self.models:
            t0 = time.perf_counter()
            self.models[shape] = synthetic.build(shape)
            print(f"== {shape}: built in {time.perf_counter() - t0:.1f} s", flush=True)
            a_a = aa_check(self.models[shape], 1, self.cfg["offset"], self.cfg["component_repeats"])
            self.summary.setdefault("a_a", {})[shape] = a_a.as_record()
            print(f"  A/A {a_a.verdict()} (plain forward)" + ("" if a_a.passed else ": reported as failed"))
        return self.models[shape]

    def write(self, name: str, data: Any) -> None:
        write_result(self.out / f"{name}.json", data)
        write_result(self.out / "summary.json", self.summary)

    def components(self) -> None:
        cfg, rows = self.cfg, []
        for shape in cfg["shapes"]:
            if not self.fits(f"components {shape}", 15):
                continue
            stack = measure_components(
                self.model(shape),
                cfg["component_widths"],
                cfg["offset"],
                cfg["component_repeats"],
                cfg["component_steps"],
            )
            rows += [{"shape": shape, **r} for r in stack]
            widths = sorted({r["width"] for r in stack})
            at = {(r["width"], r["part"]): r for r in stack}
            print(f"\n{shape}: verify cost by component, plain steps")
            print("  part       " + "".join(f"{'w=' + str(w):>8s}" for w in widths))
            for part in PARTS:
                if any(at[w, part]["seconds"] > 0 for w in widths):
                    print(f"  {part:10s} " + "".join(f"{at[w, part]['c']:8.3f}" for w in widths))
            print("  measured   " + "".join(f"{at[w, PARTS[0]]['c_step']:8.3f}" for w in widths))
            print("  off by     " + "".join(f"{at[w, PARTS[0]]['error']:+8.1%}" for w in widths))
            print("  closure    " + "".join(f"{at[w, PARTS[0]]['closure']:+8.1%}" for w in widths))
            print("  step IQR   " + "".join(f"{at[w, PARTS[0]]['step_spread']:8.1%}" for w in widths))
            # where the forward's parts stop adding up: building the graph, dispatching it, waiting for the device
            for phase in PHASES:
                print(
                    f"  {phase:9s}  "
                    + "".join(f"{1e3 * at[w, PARTS[0]][f'forward_{phase}_s']:5.1f}ms" for w in widths)
                    + "   closure "
                    + " ".join(f"{at[w, PARTS[0]][f'{phase}_closure']:+.0%}" for w in widths)
                )
            print("  gc/forward " + "".join(f"{at[w, PARTS[0]]['collections']:8.1f}" for w in widths))
            # the parts counted by phase: each component's host work, the device wait whole (phase_reading)
            by_phase = phase_reading(stack)
            print("  by phase   " + "".join(f"{by_phase[w]['phase_error']:+8.1%}" for w in widths))
            part, share = deciding_part(stack)
            self.summary.setdefault("components", {})[shape] = {
                "max_abs_error": max(abs(r["error"]) for r in stack),
                "max_abs_phase_error": max(abs(r["phase_error"]) for r in by_phase.values()),
                "max_abs_closure": max(abs(r["closure"]) for r in stack),
                "step_spread": {r["width"]: r["step_spread"] for r in stack if r["part"] == PARTS[0]},
                "deciding_part": part,
                "deciding_share": share,
            }
            print(f"  deciding part: {part} ({share:.0%} of the growth)", flush=True)
            self.write("components", rows)

    def lengths(self) -> None:
        cfg, results = self.cfg, {}
        for shape in cfg["shapes"]:
            if not self.fits(f"lengths {shape}", 20):
                continue
            profile = cost.measure(
                self.model(shape),
                widths=cfg["widths"],
                verify=("fast",),
                offset=cfg["offset"],
                repeats=cfg["repeats"],
                warmup=1,
                plain_tokens=8,
                lengths=cfg["lengths"],
            )
            max_k = max(cfg["widths"]) - 1
            per_length = {}
            print(f"\n{shape}: c(w) and a*(k) by context length")
            for length in profile.context_lengths:
                at = profile.at_length(length)
                a_star = cost.break_even_acceptance(at, 0.0, max_k, "fast")
                per_length[length] = {
                    "plain_step_s": at.plain_step_s,
                    "widths": at.widths["fast"],
                    "c": at.curve("fast").tolist(),
                    "a_star": [None if a != a else float(a) for a in a_star],
                }
                cs = " ".join(f"{w}:{c:.2f}" for w, c in zip(at.widths["fast"], at.costs["fast"]))
                stars = " ".join(f"{k}:{'never' if a != a else f'{a:.2f}'}" for k, a in enumerate(a_star, 1))
                print(f"  L={length:6d} step {1e3 * at.plain_step_s:7.2f} ms  c(w) {cs}\n           a*(k) {stars}")
            results[shape] = {"profile": profile.to_dict(), "by_length": per_length}
            self.write("lengths", results)

    def batch(self) -> None:
        cfg, rows, profiles = self.cfg, [], {}
        shapes = cfg["batch_shapes"]
        for i, shape in enumerate(shapes):
            if not self.fits(f"batch {shape}", 40):
                continue
            started, share = time.perf_counter(), self.left() / (len(shapes) - i)  # the shapes left share the budget
            model = self.model(shape)
            if shape in self.batch_profiles:  # measured by an earlier call: the grid goes on from it
                profile = BatchProfile.from_dict(self.batch_profiles[shape])
                print(f"{shape}: c(w, B) and overheads read from --batch-profiles", flush=True)
            else:
                profile = measure_batch_profile(
                    model, cfg["batch_sizes"], cfg["batch_widths"], cfg["batch_offset"], repeats=3, count_experts=False
                )
                print(f"{shape}: c(w, B) in {time.perf_counter() - started:.0f} s", flush=True)
                measure_batch_overhead(model, profile, cfg["overhead_widths"], cfg["max_tokens"], progress=print)
                print(f"{shape}: overheads by then {time.perf_counter() - started:.0f} s", flush=True)
            for w in cfg["overhead_widths"]:
                step, row = overhead_terms(profile, w)
                print(f"{shape} w={w}: engine overhead {1e3 * step:.3f} ms per step + {1e3 * row:.3f} ms per row")
            grid = batch_speedup_grid(
                model,
                profile,
                cfg["grid_batch_sizes"],
                cfg["acceptances"],
                cfg["ks"],
                prompt_len=cfg["batch_offset"],
                max_tokens=cfg["max_tokens"],
                budget_s=max(10.0, share - (time.perf_counter() - started) - 10),
                repeats=cfg["grid_repeats"],
            )
            rows += [{"shape": shape, "moe": bool(expert_layers(model)), **r} for r in grid]
            print(f"\n{shape}: batch grid, measured vs predicted (engine overheads in)")
            print("     B    a   k  measured  predicted  residual  pairs")
            for r in grid:
                print(
                    f"  {r['batch_size']:4d} {r['acceptance']:4.2f} {r['k']:3d} {r['measured']:8.2f}x "
                    f"{r['predicted_from_log']:9.2f}x {r['residual']:+9.1%}  "
                    + " ".join(f"{m:.2f}x" for m in r["measured_runs"])
                )
            errors = self.summary.setdefault("batch_mean_abs_error", {}).setdefault(shape, {})
            for b in sorted({r["batch_size"] for r in grid}):
                errors[b] = statistics.mean(abs(r["residual"]) for r in grid if r["batch_size"] == b)
            errors["all"] = statistics.mean(abs(r["residual"]) for r in grid) if grid else None
            print("  mean |residual| by B: " + " ".join(f"{b}:{e:.1%}" for b, e in errors.items() if e is not None))
            # what a perfect predictor would still miss by, from each cell's pairs' scatter
            floors = self.summary.setdefault("batch_noise_floor", {}).setdefault(shape, {})
            for b in sorted({r["batch_size"] for r in grid}):
                floors[b] = mean_absolute_error(r["noise_floor"] for r in grid if r["batch_size"] == b)
            floors["all"] = mean_absolute_error(r["noise_floor"] for r in grid)
            print("  noise floor by B:      " + " ".join(f"{b}:{e:.1%}" for b, e in floors.items()))
            # The machine's own noise beside it: how far this batch size's plain runs (one per cell) spread
            spread = self.summary.setdefault("batch_plain_spread", {}).setdefault(shape, {})
            for b in sorted({r["batch_size"] for r in grid}):
                steps = [1 / r["plain_tokens_per_s"] for r in grid if r["batch_size"] == b]
                spread[b] = (max(steps) - min(steps)) / statistics.median(steps)
            print(
                "  plain runs' spread by B (max - min over median): "
                + " ".join(f"{b}:{e:.1%}" for b, e in spread.items())
            )
            profiles[shape] = profile.to_dict()  # c(w, B), [B, 1] seconds and overheads: predictions can be redone
            self.write("batch", {"rows": rows, "profiles": profiles})


def overhead_terms(profile: BatchProfile, w: int) -> tuple[float, float]:
    """(per step, per row) seconds of the engine's own work at width w: a least-squares line through the overheads
    measured at each batch size, at the measured width nearest w (the wider on a tie); (0, 0) when none is."""
    if not profile.overhead_s:
        return 0.0, 0.0
    nearest = min(profile.overhead_s, key=lambda m: (abs(int(m) - w), -int(m)))
    sizes = np.array([int(b) for b in profile.overhead_s[nearest]], dtype=float)
    seconds = np.array(list(profile.overhead_s[nearest].values()), dtype=float)
    if len(sizes) < 2:
        return float(seconds[0]), 0.0
    row, step = np.polyfit(sizes, seconds, 1)
    return float(step), float(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes on a CPU (a smoke run)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for all phases (default 225; quick 600)")
    parser.add_argument("--phases", default="components,lengths,batch", help="comma list of phases to run")
    parser.add_argument("--shapes", default=None, help="comma list of the components and lengths phases' shapes")
    parser.add_argument("--batch-shapes", default=None, help="comma list of the batch phase's shapes (default: all)")
    parser.add_argument("--grid-batch-sizes", default=None, help="comma list of the grid's batch sizes (default: all)")
    parser.add_argument(
        "--batch-profiles", default=None, help="an earlier batch.json: its shapes' profiles are used, not measured"
    )
    args = parser.parse_args()
    cfg = dict(QUICK if args.quick else FULL)
    batch_profiles = json.loads(Path(args.batch_profiles).read_text())["profiles"] if args.batch_profiles else {}
    if args.grid_batch_sizes:
        sizes = [int(b) for b in args.grid_batch_sizes.split(",") if b]
        if not set(sizes) <= set(cfg["grid_batch_sizes"]):
            raise SystemExit(f"--grid-batch-sizes {sizes}: use some of {cfg['grid_batch_sizes']}")
        cfg["grid_batch_sizes"] = sizes
    for key, given in (("shapes", args.shapes), ("batch_shapes", args.batch_shapes)):
        if given:
            wanted = [s for s in given.split(",") if s]
            unknown = sorted(set(wanted) - set(cfg[key]))
            if unknown:
                raise SystemExit(f"unknown --{key.replace('_', '-')} {unknown}: use {', '.join(cfg[key])}")
            cfg[key] = wanted
    out = Path(os.environ.get("OUT") or "reports/gpu") / "components"
    run = Run(cfg, out, Budget(args.budget or cfg["budget"]), batch_profiles)
    phases = [p for p in args.phases.split(",") if p]
    unknown = set(phases) - {"components", "lengths", "batch"}
    if unknown:
        raise SystemExit(f"unknown phases {sorted(unknown)}: use components, lengths, batch")
    print(f"device {device_name()}; phases {', '.join(phases)}; budget {run.budget.seconds:.0f} s", flush=True)
    for phase in phases:
        getattr(run, phase)()
        gc.collect()
    run.summary["elapsed_s"] = run.budget.elapsed()
    run.write("summary", run.summary)
    print(f"\ndone in {run.summary['elapsed_s']:.0f} s; written to {out}", flush=True)


if __name__ == "__main__":
    main()
