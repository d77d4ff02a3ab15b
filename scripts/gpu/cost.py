"""Verify-cost profiles, break-even curves and the measured speedup grid on synthetic models.

    python3 -m scripts.gpu.cost            # H200: Qwen3-8B and Qwen3-30B-A3B shapes, 4-bit; hybrids if time allows
    python3 -m scripts.gpu.cost --quick    # CPU: tiny float32 shapes

On CUDA the run keeps specbench's MLX_CUDA_USE_CUDNN_SDPA=0 (unless set) so that the exact-mode grid
follows plain greedy decoding (cuDNN's decoding attention is not bit-reproducible across KV layouts:
specbench.exact).

Phases, each written out as soon as it is done (an interrupted run keeps what it finished):
profiles of the dense and MoE shapes (c(w) per verify mode, engine overhead, experts touched,
drafter costs),
the measured grid in exact verify mode (the engine's greedy default), then in fast mode, then
the hybrid shapes (with a random MTP head, its drafter timed too): profile, then the grid in
exact mode. A phase that would not fit in --budget seconds is skipped.

Each profiled model also gets an A/A arm: its plain (one-token) forward timed against itself in 6 pairs of
alternating order (``scripts.gpu.kernel_verify.aa_check``), in a_a.json: a model whose A/A fails is reported as
failed (printed), its profile cannot be told from the machine's noise.

Writes into $OUT (default reports/gpu): profiles.json, a_a.json, costs.csv, break_even.csv, grid.csv,
experts.csv, costs.png, break_even.png, measured.png; prints compact tables.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from scripts.gpu.budget import Budget
from scripts.gpu.kernel_verify import aa_check
from specbench import cost
from specbench.common.files import write_csv_atomic as write_csv
from specbench.common.identity import device_name, result_data
from specbench.common.identity import write_result as write_json
from specbench.core.experts import ExpertCounter, expert_layers
from specbench.core.forward import prefill, text_model, vocab_size
from specbench.cost.bandwidth import expected_distinct_experts, routing
from specbench.cost.breakeven import best_k, break_even_acceptance
from specbench.cost.profile import Profile, check_profile
from specbench.cost.timing import CacheRestore
from specbench.drafters import make_drafter
from specbench.models import synthetic
from specbench.report import figures

FULL = {
    "models": ["qwen3-8b-4bit", "qwen3-30b-a3b-4bit"],
    "hybrids": ["qwen3.5-9b-4bit", "qwen3.5-35b-a3b-4bit"],
    "widths": 16,
    "exact_widths": 9,
    "offset": 512,
    "repeats": 10,
    "moe_repeats": 20,
    "warmup": 3,
    "hybrid_repeats": 5,
    "hybrid_exact_widths": 5,
    "acceptances": [0.5, 0.7, 0.85, 1.0],
    "ks": [1, 2, 4, 8],
    "max_tokens": 96,
    "profile_need_s": 150.0,
    "grid_repeats": 2,
}
QUICK = {
    "models": ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny"],
    "hybrids": ["qwen3.5-9b-tiny", "qwen3.5-35b-a3b-tiny"],
    "widths": 8,
    "exact_widths": 5,
    "offset": 32,
    "repeats": 3,
    "moe_repeats": 3,
    "warmup": 1,
    "hybrid_repeats": 2,
    "hybrid_exact_widths": 3,
    "acceptances": [0.5, 1.0],
    "ks": [1, 3],
    "max_tokens": 24,
    "profile_need_s": 0.0,
    "grid_repeats": 1,
}


class Run:
    """The run's profiles, grid rows and expert counts so far, written out after each phase."""

    def __init__(self, cfg: dict, out: Path, budget: Budget, title_device: bool):
        self.cfg, self.out, self.budget = cfg, out, budget
        self.modes = list(cost.VERIFY_MODES)
        self.profiles: dict[str, cost.Profile] = {}
        self.models: dict[str, object] = {}
        self.grid: list[dict] = []
        self.experts: list[dict] = []
        self.failures: list[str] = []
        self.a_a: dict[str, dict] = {}
        self.title_device = title_device

    def profile(self, name: str, keep: bool, hybrid: bool = False) -> None:
        cfg, mtp = self.cfg, hybrid
        exact_widths = cfg["hybrid_exact_widths"] if hybrid else cfg["exact_widths"]
        t0 = time.perf_counter()
        model = synthetic.build(name, mtp=mtp)
        print(
            f"\n== {model.specbench_name}: built in {time.perf_counter() - t0:.1f} s, "
            f"{synthetic.parameter_bytes(model) / 2**30:.2f} GiB",
            flush=True,
        )
        is_moe = bool(expert_layers(model))
        if "exact" in self.modes:
            from specbench.exact import calibrate

            t0 = time.perf_counter()
            calibration = calibrate(model, list(range(2, exact_widths + 1)))
            print(
                f"exact-mode calibration in {time.perf_counter() - t0:.1f} s: "
                + " ".join(f"{w}:{c.level}" for w, c in sorted(calibration.widths.items())),
                flush=True,
            )
        drafters = [make_drafter("lookup"), make_drafter("suffix")] + (
            [make_drafter("mtp", model=model)] if mtp else []
        )
        # A context that repeats itself, so that lookup and suffix drafters find matches to time.
        vocab = text_model(model).args.vocab_size
        context = np.random.default_rng(1).integers(0, vocab, size=cfg["offset"] // 4).tolist() * 4
        t0 = time.perf_counter()
        profile = cost.measure(
            model,
            widths={m: cfg["widths"] if m == "fast" else exact_widths for m in self.modes},
            verify=self.modes,
            offset=cfg["offset"],
            warmup=cfg["warmup"],
            context=context,
            repeats=cfg["hybrid_repeats"] if hybrid else cfg["moe_repeats"] if is_moe else cfg["repeats"],
            drafters=drafters,
        )
        cost.save_profile(profile)
        self.profiles[profile.name] = profile
        a_a = aa_check(model, 1, cfg["offset"], cfg["repeats"])
        self.a_a[profile.name] = a_a.as_record()
        print(f"A/A {a_a.verdict()} (plain forward)" + ("" if a_a.passed else ": reported as failed"))
        overhead = ", ".join(f"{m} {v:.3f}" for m, v in profile.overhead.items()) or "not measured"
        print(
            f"profile in {time.perf_counter() - t0:.1f} s: plain step {1e3 * profile.plain_step_s:.2f} ms; "
            f"engine overhead per speculative step (plain steps): {overhead}"
        )
        print(
            "  drafter cost d (plain steps per draft token, k=4; mean tokens drafted): "
            + "  ".join(f"{n} {e['d']:.4f} ({e['drafted']:.1f})" for n, e in profile.drafters.items())
        )
        for mode in self.modes:
            widths, costs = profile.widths[mode], profile.costs[mode]
            print(f"  c(w)  {mode:5s}  " + " ".join(f"{w}:{c:.2f}" for w, c in zip(widths, costs)))
            a_star = cost.break_even_acceptance(profile, 0.0, min(8, widths[-1] - 1), mode)
            print(f"  a*(k) {mode:5s}  " + " ".join(f"{k}:{a:.2f}" for k, a in enumerate(a_star, 1)))
        if is_moe:
            rows = expert_counts(model, [1, 2, 3, 4, 6, 8, 12, 16], offset=min(cfg["offset"], 128), trials=3)
            self.experts += [{"name": profile.name, **r} for r in rows]
            print(
                "  experts per layer, measured/uniform: "
                + " ".join(f"w{r['width']}:{r['distinct_experts']:.1f}/{r['expected_uniform']:.1f}" for r in rows)
            )
        if keep:
            self.models[profile.name] = model
        del model
        gc.collect()
        self.flush()

    def run_grid(self, name: str, mode: str) -> None:
        cfg, profile = self.cfg, self.profiles[name]
        cells = len(cfg["acceptances"]) * len(cfg["ks"])
        estimate = grid_seconds(profile, cells, cfg["grid_repeats"], cfg["max_tokens"], mode)
        if not self.budget.fits(f"grid {name} {mode}", estimate):
            return
        t0 = time.perf_counter()
        rows = cost.speedup_grid(
            self.models[name],
            profile,
            cfg["acceptances"],
            cfg["ks"],
            verify=mode,
            prompt_len=cfg["offset"],
            max_tokens=cfg["max_tokens"],
            repeats=cfg["grid_repeats"],
        )
        self.grid += rows
        print(f"\n== grid {name} {mode}: {time.perf_counter() - t0:.1f} s (estimated {estimate:.0f} s)")
        print("\n".join(grid_lines(rows)), flush=True)
        self.flush()

    def flush(self) -> None:
        out, plist = self.out, list(self.profiles.values())
        write_json(out / "profiles.json", [p.to_dict() for p in plist])
        write_json(out / "a_a.json", {"a_a": self.a_a})
        write_csv(out / "costs.csv", [r for p in plist for r in p.to_polars().to_dicts()])
        write_csv(out / "break_even.csv", break_even_table(plist, max_k=15))
        write_csv(out / "grid.csv", self.grid)
        write_csv(out / "experts.csv", self.experts)
        self.figures()

    def figures(self) -> None:
        out, plist = self.out, list(self.profiles.values())
        if plist:
            device = plist[0].device.split(":", 1)[-1]
            what = "4-bit random weights, " if self.title_device else ""
            title = f"Verify cost c(w), dense vs MoE ({what}{device})"
            figures.save_figure(figures.verify_costs(plist, title=title), out / "costs.png")
            figures.save_figure(figures.break_even(plist, d=0.0, max_k=15), out / "break_even.png")
        if self.grid:
            figures.save_figure(figures.measured_vs_predicted(self.grid, self.profiles), out / "measured.png")


def expert_counts(
    model: nn.Module, widths: Sequence[int], offset: int = 128, trials: int = 4, seed: int = 0
) -> list[dict[str, float]]:
    """Distinct experts per layer touched by verifications of each width (random ids after a
    random ``offset``-token context), averaged over the layers the forward called and over
    ``trials``, with the uniform-routing expectation alongside."""
    num_experts, top_k = routing(model)
    rng = np.random.default_rng(seed)
    vocab = vocab_size(model)
    totals: dict[int, list[float]] = {w: [] for w in widths}
    with ExpertCounter(model) as counter:
        for _ in range(trials):
            cache = prefill(model, rng.integers(0, vocab, size=offset).tolist())
            restore = CacheRestore(cache)
            counter.take()
            for w in widths:
                mx.eval(model(mx.array(rng.integers(0, vocab, size=w).tolist())[None], cache=cache))
                called = [c for c in counter.take() if c]  # an attached MTP head's experts are not called
                totals[w].append(float(np.mean(called)))
                restore()
    return [
        {
            "width": w,
            "distinct_experts": float(np.mean(totals[w])),
            "expected_uniform": expected_distinct_experts(num_experts, top_k, w),
            "num_experts": num_experts,
            "top_k": top_k,
        }
        for w in widths
    ]


def break_even_table(
    profiles: Sequence[Profile], max_k: int = 15, acceptances: Sequence[float] = (0.6, 0.7, 0.8, 0.9)
) -> list[dict[str, Any]]:
    """a*(k) of each profile and verify mode as rows (name, mode, k, c_k1 = c(k + 1) without the engine's
    overhead, overhead, a_star, and best_k_a<x>: the best draft length at each of ``acceptances``), for k up to
    ``max_k`` (fewer where the profile is narrower)."""
    rows = []
    for p in profiles:
        for mode in p.costs:
            top = min(max_k, max(p.widths[mode]) - 1)
            best = {f"best_k_a{x:g}": best_k(x, p, 0.0, top, mode)[0] for x in acceptances}
            for k, a in enumerate(break_even_acceptance(p, 0.0, top, mode), 1):
                row = {"name": p.name, "mode": mode, "k": k, "c_k1": p.c(k + 1, mode, overhead=False)}
                rows.append({**row, "overhead": p.overhead.get(mode, 0.0), "a_star": a, **best})
    return rows


def grid_seconds(profile: Profile, cells: int, repeats: int, max_tokens: int, verify: str) -> float:
    """The seconds ``speedup_grid`` is expected to take for ``cells`` (acceptance, k) cells: a plain and a
    speculative run of ``max_tokens`` tokens per cell and repeat, with set-up, at the profile's plain step (an
    estimate fitted on H200 runs: fast verify follows its recording longer)."""
    return cells * repeats * 2.4 * max_tokens * profile.plain_step_s * (1.6 if verify == "fast" else 1.2) + 5


def grid_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """``speedup_grid``'s rows as a compact table: measured against predicted speedup per cell."""
    lines = ["     a   k  measured  predicted  err%  from-log err%  E_meas  a_meas  diverged follows"]
    for r in rows:
        lines.append(
            f"  {r['a']:.2f} {r['k']:3d}  {r['speedup']:7.2f}  {r['predicted_nominal']:8.2f}  "
            f"{100 * r['error_nominal']:+5.1f}  {100 * r['error_from_log']:+12.1f}  {r['tokens_per_verify']:6.2f}"
            f"  {r['acceptance_measured']:6.2f}  {r['diverged_at']!s:>8s} {r['follows']:7d}"
        )
    return lines


def prediction_error_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Per verify mode of ``speedup_grid``'s rows: the mean and largest |measured / predicted - 1| of the speedup
    and of the seconds per token, at the nominal acceptance and for the steps taken, and how the plain runs'
    seconds per token compare with the profile's plain step."""
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        cells = [r for r in rows if r["mode"] == mode]
        for label, at_nominal, for_steps in (
            ("speedup", "error_nominal", "error_from_log"),
            ("seconds per token", "error_time_nominal", "error_time"),
        ):
            nominal = [abs(r[at_nominal]) for r in cells]
            logged = [abs(r[for_steps]) for r in cells]
            lines.append(
                f"\nprediction error of the {label} |measured / predicted - 1|, {mode} verify, {len(cells)} cells: "
                f"at nominal a mean {100 * sum(nominal) / len(cells):.1f}% max {100 * max(nominal):.1f}%; "
                f"for the steps taken mean {100 * sum(logged) / len(cells):.1f}% max {100 * max(logged):.1f}%"
            )
        ratio = sorted(r["plain_over_profile"] for r in cells)
        lines.append(
            f"plain runs' seconds per token / the profile's plain step: median {ratio[len(ratio) // 2]:.2f} "
            f"({ratio[0]:.2f}-{ratio[-1]:.2f})"
        )
    return lines


def replot(folder: Path) -> int:
    """Redraw costs.png, break_even.png and measured.png from a finished run's files."""
    import polars as pl

    run = Run(dict(FULL), folder, Budget(0.0), title_device=True)
    stored = result_data(json.loads((folder / "profiles.json").read_text()))
    run.profiles = {p.name: p for p in map(check_profile, stored)}
    if (folder / "grid.csv").exists():
        run.grid = pl.read_csv(folder / "grid.csv", infer_schema_length=None).to_dicts()
        for r in run.grid:  # runs from before these columns existed
            if r.get("predicted_spec_s_per_token") is None and r.get("predicted_from_log"):
                r["predicted_spec_s_per_token"] = r["plain_step_s_profile"] / r["predicted_from_log"]
    run.figures()
    print(f"figures redrawn in {folder}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny float32 shapes (CPU)")
    parser.add_argument("--models", default=None, help="comma list of synthetic names profiled and run on the grid")
    parser.add_argument("--hybrids", default=None, help="comma list of synthetic names only profiled ('' for none)")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds; phases that would not fit are skipped")
    parser.add_argument(
        "--replot",
        default=None,
        metavar="DIR",
        help="only redraw the figures in DIR from its profiles.json and grid.csv (no model is run)",
    )
    args = parser.parse_args()
    if args.replot:
        return replot(Path(args.replot))
    cfg = dict(QUICK if args.quick else FULL)
    if args.models is not None:
        cfg["models"] = [m for m in args.models.split(",") if m]
    if args.hybrids is not None:
        cfg["hybrids"] = [m for m in args.hybrids.split(",") if m]
    out = Path(os.environ.get("OUT") or "reports/gpu")
    out.mkdir(parents=True, exist_ok=True)
    run = Run(cfg, out, Budget(args.budget), title_device=not args.quick)
    print(f"device {device_name()}  mlx {mx.__version__}  verify modes {run.modes}  out {out}", flush=True)

    for name in cfg["models"]:
        # A profile (with exact-mode calibration) took 80-190 s per 4-bit shape on an H200.
        if run.budget.fits(f"profile {name}", cfg["profile_need_s"]):
            run.profile(name, keep=True)
    names = list(run.models)
    for mode in [m for m in ("exact", "fast") if m in run.modes]:
        for name in names:
            run.run_grid(name, mode)
    run.models.clear()
    gc.collect()
    mx.clear_cache()
    for name in cfg["hybrids"]:
        if not run.budget.fits(f"hybrid {name}", 120.0):
            continue
        try:
            run.profile(name, keep=True, hybrid=True)
            for profile_name in list(run.models):
                run.run_grid(profile_name, run.modes[-1])
        except Exception as err:  # a shape this backend cannot run is reported, not fatal
            run.failures.append(f"hybrid {name}: {type(err).__name__}: {err}")
            print(f"hybrid {name} failed: {type(err).__name__}: {err}", flush=True)
        run.models.clear()
        gc.collect()
        mx.clear_cache()

    for line in prediction_error_lines(run.grid):
        print(line)
    for line in run.budget.skipped_lines() + run.failures:
        print(f"skipped: {line}")
    print(f"done in {run.budget.elapsed():.1f} s; files in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
