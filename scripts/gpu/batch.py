"""Batched speculative decoding on synthetic shapes: c(w, B), break-even a*(k, B), the measured grid,
throughput against mlx-lm's BatchGenerator, first-divergence statistics, and a verdict.

    python3 -m scripts.gpu.batch --budget 420   # H200: Qwen3-8B, Qwen3-30B-A3B, Qwen3.5-9B, 4-bit, B <= 32
    python3 -m scripts.gpu.batch --quick        # CPU: tiny float32 shapes, < 60 s
    python3 -m scripts.gpu.batch --exact --budget 480   # exact batches only (dense and MoE shapes)

Per shape, each phase written out as soon as it is done (an interrupted run keeps what it finished),
skipped when it would not fit in --budget, and a batch size whose forward fails (an MLX kernel that
does not launch) recorded in "failures" while the run goes on:
  1. the profile c(w, B) (fast verification; distinct experts per [B, w] block for the MoE shape);
  2. the measured grid at B in {1, 4, 16, 32} (oracle drafters at controlled acceptance, fixed k,
     speculative vs plain batched, against the profile's prediction);
  3. the bench at B in {1, 4, 16, 32}: speculative batched (oracle drafters at a = 0.8, k = 3) vs plain
     batched vs mlx-lm, ratios in one run; the oracles draft the plain batched output of the same batch,
     recorded before the speculative run (no model work inside a timed run);
  4. first divergence per request of each engine's greedy output from mlx-lm's and from single-request
     greedy decoding (fast verification).
Then the hybrid Qwen3.5-9B 4-bit shape (Gated DeltaNet layers rolled back per row): its profile and
grid. Then, budget permitting, the embedded SmolLM2-135M with real drafters (prompt lookup,
SuffixDecoding) on two bundled prompts per category and the chat-revision trace's turns at B in
{1, 4, 16}; and the verdict: at which batch sizes speculation pays for each shape. The phases and the
verdict are ``scripts.gpu.batch_run``'s, the figure ``batch_break_even`` here.

Writes into $OUT (or --out, default reports/gpu-batch): batch_summary.json (profiles, a*, divergence
summary, verdict, failures, skipped), batch_costs.csv, batch_break_even.csv, batch_experts.csv,
batch_grid.csv, batch_bench.csv, batch_divergence.csv, batch_break_even.png.

With --exact, only the exact phase runs (``BatchRun.exact``), per synthetic shape (dense and MoE) at B in
{1, 4, 16, 32}, acceptance 0.8, k = 3: whether every request's exact batched output (``verify="exact"``) equals
its own single-request mlx-lm greedy output, and exact vs fast batched seconds per step, their ratio measured in
one run with an A/A arm (the fast batch timed again, ``scripts.result_lines.AACheck``). It writes
batch_exact.json (with the run's provenance: commit, versions, device) and batch_exact.csv.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scripts.gpu.batch_run import BatchRun
from scripts.gpu.budget import Budget
from specbench.inputs.traces import TRACES_DIR
from specbench.models import synthetic

FULL = {
    "models": ["qwen3-8b-4bit", "qwen3-30b-a3b-4bit"],
    "hybrid": "qwen3.5-9b-4bit",
    "batch_sizes": [1, 2, 4, 8, 16, 32],
    "widths": 8,
    "offset": 256,
    "repeats": 5,
    "warmup": 2,
    "grid_batch_sizes": [1, 4, 16, 32],
    "acceptances": [0.6, 0.9],
    "ks": [2, 4],
    "prompt_len": 64,
    "max_tokens": 32,
    "bench_batch_sizes": [1, 4, 16, 32],
    "bench_tokens": 48,
    "bench_acceptance": 0.8,
    "bench_k": 3,
    "single": 8,
    "max_k": 7,
    "embedded": "smollm2-135m",
    "embedded_batch_sizes": [1, 4, 16],
    "embedded_tokens": 64,
    "embedded_prompts": 16,
    "embedded_turns": None,
    "exact_batch_sizes": [1, 4, 16, 32],
    "exact_tokens": 32,
    "exact_repeats": 6,
}
QUICK = {
    "models": ["qwen3-8b-tiny", "qwen3-30b-a3b-tiny"],
    "hybrid": "qwen3.5-9b-tiny",
    "batch_sizes": [1, 2, 4],
    "widths": 4,
    "offset": 16,
    "repeats": 2,
    "warmup": 1,
    "grid_batch_sizes": [1, 4],
    "acceptances": [0.8],
    "ks": [2],
    "prompt_len": 8,
    "max_tokens": 10,
    "bench_batch_sizes": [1, 4],
    "bench_tokens": 10,
    "bench_acceptance": 0.8,
    "bench_k": 3,
    "single": 2,
    "max_k": 3,
    "embedded": "tiny:smollm2-135m",
    "embedded_batch_sizes": [4],
    "embedded_tokens": 8,
    "embedded_prompts": 4,
    "embedded_turns": 2,
    "exact_batch_sizes": [1, 4],
    "exact_tokens": 8,
    "exact_repeats": 6,
}


def say(text: str) -> None:
    print(text, flush=True)


#: The draft lengths whose a*(k, B) the figure's left panel draws.
SHOWN_K = (1, 2, 4)


def batch_break_even(break_even: Sequence[dict[str, Any]], grid: Sequence[dict[str, Any]], k_grid: int) -> Any:
    """Two panels per shape (``model``): a*(k, B) for k in ``SHOWN_K``, and the grid's measured (points) and
    predicted (lines) throughput speedups at ``k_grid`` per acceptance. Returns the Figure."""
    import matplotlib.pyplot as plt
    import polars as pl

    from specbench.report.figures.checks import mark_coinciding

    keys = {"model": pl.Utf8, "batch_size": pl.Int64, "k": pl.Int64}  # and each table's values
    a_star_schema = keys | {"a_star": pl.Float64}
    grid_schema = keys | {c: pl.Float64 for c in ("acceptance", "measured", "predicted")}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    a_stars = pl.DataFrame(list(break_even), schema=a_star_schema).filter(pl.col("k").is_in(SHOWN_K))
    for (label,), rows in a_stars.group_by("model", maintain_order=True):
        for (k,), line in rows.sort("k", "batch_size").group_by("k", maintain_order=True):
            axes[0].plot(*line.select("batch_size", "a_star").to_numpy().T, marker="o", label=f"{label} k={k}")
    cells = pl.DataFrame(list(grid), schema=grid_schema).filter(pl.col("k") == k_grid)
    for (label,), rows in cells.group_by("model", maintain_order=True):
        for (a,), line in rows.sort("acceptance", "batch_size").group_by("acceptance", maintain_order=True):
            sizes, measured, predicted = line.select("batch_size", "measured", "predicted").to_numpy().T
            drawn = axes[1].plot(sizes, predicted, label=f"{label} a={a} predicted")[0]
            axes[1].scatter(sizes, measured, color=drawn.get_color(), label=f"{label} a={a} measured")
    axes[0].set(xlabel="batch size B", ylabel="break-even acceptance a*(k, B)", title="Break-even acceptance")
    speedup = f"throughput speedup (k={k_grid})"
    axes[1].set(xlabel="batch size B", ylabel=speedup, title="Measured against predicted speedup")
    axes[1].axhline(1.0, color="grey", lw=0.8)
    for ax in axes:
        ax.set_xscale("log")
        mark_coinciding(ax)
        if ax.lines or ax.collections:
            ax.legend(fontsize=6)
    return fig


def write_figure(run: BatchRun) -> None:
    """batch_break_even.png, where a*(k, B) was measured."""
    if run.tables["break_even"]:
        from specbench.report.figures.style import save_figure

        fig = batch_break_even(run.tables["break_even"], run.tables["grid"], max(run.cfg["ks"]))
        save_figure(fig, run.out / "batch_break_even.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes on the CPU (< 60 s)")
    parser.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run (default 420)")
    parser.add_argument("--out", default=os.environ.get("OUT") or "reports/gpu-batch")
    parser.add_argument("--no-embedded", action="store_true", help="leave out the embedded model's real drafters")
    parser.add_argument("--no-hybrid", action="store_true", help="leave out the hybrid (Gated DeltaNet) shape")
    parser.add_argument("--models", default=None, help="comma list of synthetic shapes (default: dense and MoE)")
    parser.add_argument("--profile-share", type=float, default=0.25, help="share of a shape's time for c(w, B)")
    parser.add_argument(
        "--exact", action="store_true", help="only exact batches against single-request greedy, and their cost"
    )
    args = parser.parse_args()
    cfg = dict(QUICK if args.quick else FULL)
    cfg["profile_share"] = args.profile_share
    if args.models:
        cfg["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
        for name in cfg["models"]:
            try:
                synthetic.parse(name)
            except ValueError as err:
                parser.error(str(err))
    budget = Budget(args.budget, say=say)
    run = BatchRun(cfg, Path(args.out), budget, say=say)
    if args.exact:
        for i, name in enumerate(cfg["models"]):
            run.exact(name, budget.until((i + 1) / len(cfg["models"])))
        run.save_exact()
        say(f"\ndone in {budget.elapsed():.0f} s; failures: {len(run.failures)}; results in {run.out}")
        return
    embedded_s = 0.0 if args.no_embedded else 0.15 * args.budget
    reserve = embedded_s + (0.0 if args.no_hybrid else 0.15 * args.budget)
    for i, name in enumerate(cfg["models"]):
        run.shape(name, (budget.left() - reserve) / (len(cfg["models"]) - i))
    if not args.no_hybrid:
        run.shape(cfg["hybrid"], budget.left() - embedded_s, bench=False)
    if not args.no_embedded:
        run.embedded(TRACES_DIR / "chat-revision.jsonl")
    run.conclude()
    write_figure(run)
    run.save()
    say(
        f"\ndone in {budget.elapsed():.0f} s; failures: {len(run.failures)}; "
        f"skipped: {budget.skipped_lines() or 'nothing'}; results in {run.out}"
    )


if __name__ == "__main__":
    main()
