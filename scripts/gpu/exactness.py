"""Exact verification on the device: speculative greedy output == plain greedy, and what it costs.

    python3 -m scripts.gpu.exactness           # H200, about 6 minutes (--budget 360)
    python3 -m scripts.gpu.exactness --quick   # CPU smoke run: tiny float32 models, well under a minute

Models, in this order (a model is skipped when the budget is spent): random-weight Qwen3-8B (bfloat16) and
Qwen3-30B-A3B (4-bit) shapes at --layers depth with the full workload (20 prompts x 128 tokens), the embedded
SmolLM2-135M, then the Qwen3-8B 4-bit and Qwen3-30B-A3B bfloat16 shapes with fewer prompts; then, if time is left,
the full-depth Qwen3-8B shape in 4-bit for costs. Per model:

1. calibration: for widths 2..16, which exact levels are bit-identical to serial steps (at a short cache and across
   the KV buffer's 256-row step), and the cheapest (specbench.exact.calibrate);
2. exactness (``scripts.gpu.exactness_workload``): P prompts x T tokens, mlx-lm's plain greedy decoding against
   speculative greedy (``verify="exact"`` and ``"fast"``) with an oracle drafter that proposes the plain
   continuation with random corruptions (drafts partly accepted), draft lengths cycling through --ks; then the
   same as token trees (modes exact-tree, fast-tree: --tree-branches such drafts of k tokens merged where they
   agree, at most 15 nodes); prompts equal / total and first divergence positions;
3. end-to-end (primary models, first --e2e-prompts prompts): wall time of plain, exact and fast (fast drafting from
   its own output, so its acceptance is not cut by its divergences); "cold" is the first run of a prompt, "warm"
   an identical second run (on CUDA a verify of w > 1 queries builds a cuDNN attention graph per key length the
   first time it sees it, which dominates cold fast-mode times); and a replay of the exact run's steps at each
   mode's measured verify costs;
4. verify cost: width 1..16 forwards per level at a cache offset of --offset tokens, median of --repeats after
   warm-up, relative to a width-1 forward (``scripts.gpu.verify_calls.level_seconds``).

--ops also runs the op probe (which row-wise ops are row-invariant; specbench.exact.probe_ops; slow on CUDA, where
each new shape compiles kernels). specbench runs with MLX_CUDA_USE_CUDNN_SDPA=0 unless it is set; --cudnn-sdpa sets
it to 1 for the whole run (reference included), to count what cuDNN's layout-dependent decoding attention does.
Writes into $OUT (default reports/gpu): ops.csv, calibration.csv, exactness.csv, e2e.csv, cost.csv, summary.json,
exactness.png; prints compact tables.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if __name__ == "__main__" and "--cudnn-sdpa" in sys.argv:
    os.environ["MLX_CUDA_USE_CUDNN_SDPA"] = "1"  # read by MLX when it first dispatches attention

import mlx.core as mx

from scripts.gpu import exactness_workload as workload
from scripts.gpu import verify_calls as calls
from scripts.gpu.budget import Budget
from specbench.checks import exactness
from specbench.common.files import write_csv_atomic as write_csv
from specbench.common.files import write_figure_atomic
from specbench.common.identity import device_name
from specbench.common.identity import write_result as write_json
from specbench.exact import calibrate, probe_ops
from specbench.models import load as models
from specbench.models import synthetic

FULL = {
    "models": ["qwen3-8b-bf16", "qwen3-30b-a3b-4bit", "smollm2-135m", "qwen3-8b-4bit", "qwen3-30b-a3b-bf16"],
    **{"full_depth": ["qwen3-8b-4bit"], "layers": 4, "prompts": 20, "tokens": 128, "ks": [2, 4, 7, 15]},
    "tree_branches": 2,
    "acceptance": 0.8,
    # Fewer prompts for the models after the primary dense and MoE ones; e2e and cost for the primaries.
    "secondary_prompts": {"smollm2-135m": 8, "qwen3-8b-4bit": 6, "qwen3-30b-a3b-bf16": 6},
    **{"primary": ["qwen3-8b-bf16", "qwen3-30b-a3b-4bit"], "e2e_prompts": 4},
    **{"widths": 16, "offset": 512, "repeats": 5, "warmup": 1, "calibration_repeats": 2},
    **{"cost_widths": [1, 2, 3, 4, 6, 8, 12, 16], "full_depth_widths": [1, 2, 3, 4, 6, 8, 12, 16]},
    **{"full_depth_prompts": 4, "full_depth_repeats": 3, "probe_dtypes": ["bfloat16"], "probe_widths": [2, 8]},
    # Seconds a model is expected to take at least: it is skipped when fewer are left in the budget.
    **{"model_need_s": 30, "full_depth_need_s": 90},
}
QUICK = {
    **{"models": ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny", "smollm2-135m"], "full_depth": [], "layers": None},
    **{"prompts": 3, "tokens": 16, "ks": [1, 3], "acceptance": 0.8, "secondary_prompts": {}, "tree_branches": 2},
    **{"primary": ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny"], "e2e_prompts": 2},
    **{"widths": 4, "offset": 32, "repeats": 2, "warmup": 1, "calibration_repeats": 1},
    **{"cost_widths": [1, 2, 3, 4], "full_depth_prompts": 1, "full_depth_widths": [1, 2], "full_depth_repeats": 1},
    **{"probe_dtypes": ["float32"], "probe_widths": [2, 4], "model_need_s": 0, "full_depth_need_s": 0},
}
#: The embedded model runs a smaller workload in --quick (it decodes at a few tokens/s on the CPU).
QUICK_EMBEDDED = {"prompts": 1, "tokens": 6, "ks": [3], "widths": 4, "cost_widths": [1, 2]}


# -- one model -------------------------------------------------------------------------------


def load_model(name: str, layers: int | None) -> tuple[Any, list[list[int]] | None, str]:
    """(model, prompts or None for random ones, dtype label)."""
    if name == "smollm2-135m":
        model, tokenizer = models.load(name)
        return model, workload.bundled_first_turns(tokenizer), workload.dtype_label(model)
    model = synthetic.build(name, layers=None if "tiny" in name else layers)
    return model, None, workload.dtype_label(model)


def run_model(name: str, cfg: dict, quick: bool, deadline: float, results: dict, full_depth: bool = False) -> None:
    embedded = name == "smollm2-135m"
    own = dict(cfg)
    if quick and embedded:
        own.update(QUICK_EMBEDDED)
    if full_depth:
        own.update(prompts=cfg["full_depth_prompts"])
    elif name in cfg["secondary_prompts"] and cfg["prompts"] == FULL["prompts"]:
        own.update(prompts=cfg["secondary_prompts"][name])
    primary = full_depth or name in cfg["primary"]
    label = name + ("" if full_depth or "tiny" in name or embedded else f"-{cfg['layers']}l")
    t_start = time.perf_counter()
    try:
        model, prompts, dtype = load_model(name, None if full_depth else cfg["layers"])
    except Exception as err:  # the embedded model needs its wheel staged; report and go on
        print(f"[{label}] skipped: could not load ({type(err).__name__}: {err})", flush=True)
        results["skipped"].append({"model": label, "reason": f"{type(err).__name__}: {err}"})
        return
    kind = "MoE" if workload.is_moe(model) else "dense"
    print(f"[{label}] {dtype}, {kind}, built in {time.perf_counter() - t_start:.1f}s", flush=True)
    if prompts is None:
        prompts = exactness.random_prompts(model, own["prompts"], lengths=(8, 24) if quick else (96, 224))
    prompts = prompts[: own["prompts"]]
    widths = cfg["full_depth_widths"] if full_depth else own["cost_widths"]
    if not cfg["cost"]:
        widths = []  # no cost table: only the widths the workload verifies are calibrated
    # The widths the workload verifies (k + 1; a tree's nodes + 1) and the cost table measures.
    trees = (
        {exactness.tree_nodes(k, own["tree_branches"]) + 1 for k in own["ks"]} if own["tree_branches"] > 1 else set()
    )
    needed = sorted({w for w in widths if w > 1} | {k + 1 for k in own["ks"]} | trees)

    # 1. calibration
    t0 = time.perf_counter()
    calibration = calibrate(model, needed, repeats=cfg["calibration_repeats"])
    print(f"[{label}] calibrated widths {needed} in {time.perf_counter() - t0:.1f}s", flush=True)
    chosen = {w: calibration.level_for(w) for w in needed}
    results["calibration"] += [{"model": label, "dtype": dtype, **r} for r in calibration.rows()]
    print("  levels: " + "  ".join(f"{w}:{lv}" for w, lv in chosen.items()), flush=True)

    # 2 + 3. exactness and end-to-end on the workload
    logs: dict[str, list[Any]] = {}
    if not full_depth or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        e2e = own["e2e_prompts"] if primary else 0
        done = workload.run_workload(
            model, label, dtype, prompts, own["tokens"], own["ks"], own["acceptance"], e2e, own["tree_branches"]
        )
        print(f"[{label}] workload {len(prompts)} prompts x {own['tokens']} tokens in {time.perf_counter() - t0:.1f}s")
        results["exactness"] += done.rows
        results["exactness_summary"] += done.summary
        results["e2e"] += done.e2e
        logs = done.logs
        workload.print_table(done.summary, [*workload.SUMMARY_KEYS, "accepted_per_verify"])
        keys = ["model", "kind", "k", "speedup_exact", "speedup_fast", "exact_over_fast", "mat_exact", "mat_fast"]
        workload.print_table(done.e2e, keys)

    # 4. verify cost
    if not primary or not cfg["cost"]:
        pass
    elif time.perf_counter() > deadline:
        print(f"[{label}] verify cost skipped: past the time budget", flush=True)
    else:
        levels = ["fast", "attention", "attention+linear/vector", "serial", "exact"]
        t0 = time.perf_counter()
        repeats = cfg["full_depth_repeats"] if full_depth else cfg["repeats"]
        cache = calls.filled_cache(model, cfg["offset"], seed=1)
        seconds = calls.level_seconds(model, cache, levels, widths, repeats, cfg["warmup"])
        base = seconds["fast"][1]
        results["cost"] += workload.cost_rows(label, dtype, seconds, chosen)
        took = time.perf_counter() - t0
        print(f"[{label}] verify cost (x width-1 forward of {1e3 * base:.2f} ms) in {took:.1f}s", flush=True)
        rows = [{"level": lv, **{f"w{w}": per[w] / base for w in widths}} for lv, per in seconds.items()]
        workload.print_table(rows, ["level", *[f"w{w}" for w in widths]])
        replayed = workload.replay_rows(label, logs, seconds) if logs else []
        results["e2e"] += replayed
        workload.print_table(replayed, ["model", "kind", "k", "speedup_exact", "speedup_fast", "exact_over_fast"])
    del model
    gc.collect()
    mx.clear_cache()


# -- figure ----------------------------------------------------------------------------------

COLORS = {"fast": "black", "exact": "tab:red", "attention": "tab:blue", "attention+linear/vector": "tab:orange"}
COLORS |= {"attention+linear": "tab:green", "attention+linear+experts": "tab:purple", "serial": "tab:brown"}


def figure(cost_rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in cost_rows))
    if not models:
        return
    cols = min(3, len(models))
    rows = (len(models) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, model in zip(axes.flat, models):
        mine = [r for r in cost_rows if r["model"] == model]
        for level in dict.fromkeys(r["level"] for r in mine):
            pts = sorted((r["width"], r["ratio"]) for r in mine if r["level"] == level)
            style = {"fast": dict(lw=2), "exact": dict(lw=2.5)}.get(level, dict(lw=1, alpha=0.8))
            ax.plot(*zip(*pts), marker="o", ms=3, label=level, color=COLORS.get(level, "tab:gray"), **style)
        ax.set_title(f"{model} ({mine[0]['dtype']})", fontsize=9)
        ax.set_xlabel("verify width w")
        ax.set_ylabel("time / width-1 forward")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(models) :]:
        ax.axis("off")
    fig.suptitle(f"Verify cost per exact level ({device_name()}, mlx {mx.__version__})", fontsize=10)
    fig.tight_layout()
    write_figure_atomic(fig, path, dpi=110)


# -- main ------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--quick", action="store_true", help="tiny float32 models (CPU smoke run)")
    add("--models", default=None, help="comma-separated: synthetic names and/or smollm2-135m")
    add("--full-depth", default=None, help="comma-separated synthetic names measured at full depth ('' for none)")
    add("--layers", type=int, default=None, help="depth of the synthetic models (default 4)")
    add("--prompts", type=int, default=None)
    add("--tokens", type=int, default=None)
    add("--ks", default=None, help="comma-separated draft lengths (prompt i drafts the i-th, cyclically)")
    add("--tree-branches", type=int, default=None, help="token trees of this many drafts per k too (0: paths only)")
    add("--no-cost", action="store_true", help="skip the verify-cost tables (exactness and end to end only)")
    add("--e2e-prompts", type=int, default=None, help="prompts of each primary model also timed end to end")
    add("--ops", action="store_true", help="also run the op probe (slow on CUDA)")
    sdpa_help = "MLX_CUDA_USE_CUDNN_SDPA=1 (cuDNN attention) for the whole run, reference included"
    add("--cudnn-sdpa", action="store_true", help=sdpa_help)
    budget_help = "seconds; a model that would end past it, and cost sweeps starting past it, are skipped"
    add("--budget", type=float, default=360.0, help=budget_help)
    args = parser.parse_args()
    cfg = dict(QUICK if args.quick else FULL)
    for key in ("layers", "prompts", "tokens", "tree_branches", "e2e_prompts"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if args.ks is not None:
        cfg["ks"] = [int(k) for k in args.ks.split(",") if k]
    cfg["cost"] = not args.no_cost
    if args.prompts is not None:  # every model runs the number asked for
        cfg["secondary_prompts"] = {}
    if args.models is not None:
        cfg["models"] = [m for m in args.models.split(",") if m]
    if args.full_depth is not None:
        cfg["full_depth"] = [m for m in args.full_depth.split(",") if m]
    out = Path(os.environ.get("OUT") or "reports/gpu")
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    print(
        f"device {device_name()}  mlx {mx.__version__}  out {out}  budget {args.budget:.0f}s  "
        f"cuDNN attention {'off' if os.environ.get('MLX_CUDA_USE_CUDNN_SDPA') == '0' else 'on'}",
        flush=True,
    )
    results: dict[str, list] = {
        k: [] for k in ("ops", "calibration", "exactness", "exactness_summary", "e2e", "cost", "skipped")
    }

    if args.ops:
        t0 = time.perf_counter()
        for dtype in cfg["probe_dtypes"]:
            results["ops"] += probe_ops(getattr(mx, dtype), widths=cfg["probe_widths"])
        variant = ", ".join(workload.not_row_invariant(results["ops"])) or "none"
        print(f"op probe ({time.perf_counter() - t0:.1f}s): not row-invariant: {variant}", flush=True)
        write_csv(out / "ops.csv", results["ops"])

    plan = [(m, False) for m in cfg["models"]] + [(m, True) for m in cfg["full_depth"]]
    for name, full in plan:
        need = cfg["full_depth_need_s"] if full else cfg["model_need_s"]
        if not budget.fits(f"[{name}]" + (" full depth" if full else ""), need):
            results["skipped"].append({"model": name + (" (full depth)" if full else ""), "reason": "time budget"})
            continue
        try:
            run_model(name, cfg, args.quick, budget.deadline, results, full_depth=full)
        except Exception as err:  # keep what the other models give
            traceback.print_exc()
            results["skipped"].append({"model": name, "reason": f"failed: {type(err).__name__}: {err}"})
            gc.collect()
            mx.clear_cache()
        write_outputs(out, results)

    write_outputs(out, results)
    print("exactness (speculative greedy vs plain greedy):")
    workload.print_table(results["exactness_summary"], workload.SUMMARY_KEYS)
    print("end to end (measured: wall time, cold = first run of a prompt, warm = second; replay: exact run's steps")
    print("at each mode's costs):")
    workload.print_table(results["e2e"], ["model", "kind", "k", "speedup_exact", "speedup_fast", "exact_over_fast"])
    all_equal = workload.all_equal(results["exactness_summary"])
    for r in results["skipped"]:
        print(f"skipped {r['model']}: {r['reason']}")
    print(
        f"exact mode bit-identical to plain greedy on every prompt: {all_equal}  ({budget.elapsed():.0f}s total)",
        flush=True,
    )
    return 0 if all_equal else 1


def write_outputs(out: Path, results: dict) -> None:
    write_csv(out / "calibration.csv", results["calibration"])
    write_csv(out / "exactness.csv", results["exactness"])
    write_csv(out / "e2e.csv", results["e2e"])
    write_csv(out / "cost.csv", results["cost"])
    summary = {"device": device_name(), "mlx": mx.__version__, **workload.summary(results)}
    write_json(out / "summary.json", summary)
    if results["cost"]:
        figure(results["cost"], out / "exactness.png")


if __name__ == "__main__":
    sys.exit(main())
