"""The paired A/B summaries as text: per cell the ratio with its intervals and verdicts, the worst cell, verify
steps in the loop against per-call timings, where the method's extra seconds went, slow steady steps, the
pooled rows and the per-call verify timings at 9 rows."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from scripts.gpu.default_policy_cells import Pair, cell_means
from scripts.gpu.run_speed import NEAR, SLOW
from specbench.bench.paired import MIN_UNITS

HEADER = (
    "\n== Auto / specbench plain per cell: seconds ratio over every (plain, Auto) pair [95 % bootstrap interval]; "
    "the same in plain steps (each run's seconds over its own speed, see speed_state) [interval]; in mean "
    "steps (over its mean steady step, see mean_speed: not a criterion) [interval]; verdict against 0.97 on "
    "seconds (and on plain steps)"
)


def cell_line(row: Mapping[str, Any]) -> str:
    """One cell's line: ratio [interval], in plain steps, in mean steps, pairs, verdicts, what Auto did."""
    extra = (
        f"; vs mlx-lm {row['vs_mlx_lm']:.2f}x; verifies {row['verifies']:.0f}, paused {row['paused']:.0f} tokens"
        if row.get("ks") is not None
        else ""
    )
    same = "" if row["equal_plain"] is None else f"; equal to plain: {row['equal_plain']}"
    return (
        f"  {row['model']:20s} {row['what']:28s} {row['method']:12s} {row['ratio']:.2f}x "
        + (f"[{row['low']:.2f}-{row['high']:.2f}]" if row["pairs"] >= MIN_UNITS else "[too few pairs]")
        + (
            f" in plain steps {row['in_steps']:.3f}x [{row['steps_low']:.3f}-{row['steps_high']:.3f}]"
            + (f" ({row['steps_in_seconds']} in seconds)" if row.get("steps_in_seconds") else "")
            if row["in_steps"] is not None
            else " in plain steps -"
        )
        + (
            f"; in mean steps {row['in_mean_steps']:.3f}x [{row['mean_steps_low']:.3f}-{row['mean_steps_high']:.3f}]"
            if row.get("in_mean_steps") is not None
            else ""
        )
        + f" ({row['pairs']} pairs) {row['verdict']:12s}"
        + (f" (in plain steps: {row['verdict_in_steps']})" if row["verdict_in_steps"] else "")
        + f"{extra}{same}"
    )


def worst_line(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The worst judged cell and the count of each verdict (None without a judged cell)."""
    rows = [r for r in rows if r["verdict"] != "a/a"]
    if not rows:
        return None
    worst = min(rows, key=lambda r: r["ratio"])
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("holds", "ok", "inconclusive", "LOSES")}
    exact_equal = all(r["equal_plain"] is not False for r in rows)
    return (
        f"worst cell: {worst['ratio']:.2f}x ({worst['model']} {worst['what']} {worst['method']}, "
        f"{worst['verdict']}); verdicts of {len(rows)} cells: {counts}; "
        f"outputs equal to plain greedy on every checked run: {exact_equal}"
    )


def loop_lines(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Median in-loop seconds of a verify step by width, per model and verify mode (or method)."""
    lines = ["\n== in the loop: median seconds of a verify step by width (ms), against the per-call timings above"]
    loop: dict[tuple[str, str], dict[int, list[float]]] = {}
    for r in runs:
        for item in (r.get("verify_ms") or "").split():
            w, ms = item.split(":")
            label = r["what"].split()[0]  # a shape's verify mode; the embedded model's method (exact verify)
            label = r["method"] if label in ("category", "trace") else label
            loop.setdefault((r["model"], label), {}).setdefault(int(w), []).append(float(ms))
    for (model, mode), widths in loop.items():
        cells = " ".join(f"{w}:{statistics.median(v):.1f}" for w, v in sorted(widths.items()))
        lines.append(f"  {model:20s} {mode:12s} {cells}")
    return lines


def breakdown_lines(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where Auto's extra seconds went per cell (``Pair.excess_in_steps``) and its slow steady steps."""
    lines = []
    if excess := cell_means(runs, Pair.excess_in_steps):
        parts = list(next(iter(excess.values())))
        lines.append(
            "\n== where Auto's seconds beyond plain's went, plain steps per run (mean over pairs; see "
            "excess_in_steps): " + ", ".join(parts)
        )
        for (model, what, method), mean in excess.items():
            cells = " ".join(f"{mean[part]:+6.1f}" for part in parts)
            lines.append(f"  {model:20s} {what:28s} {method:12s} {cells}  total {sum(mean.values()):+6.1f}")
    if slow := cell_means(runs, Pair.slow_counts):
        lines.append(
            f"\n== steady steps over {SLOW}x their run's median, per run (mean over pairs): Auto (of them at most "
            f"{NEAR} steps after a step that was not steady), plain"
        )
        for (model, what, method), mean in slow.items():
            counts = f"{mean['auto']:5.1f} ({mean['near']:4.1f})  plain {mean['plain']:5.1f}"
            lines.append(f"  {model:20s} {what:28s} {method:12s} {counts}")
    return lines


def summary_lines(out: Mapping[str, Any], cuts: Sequence[str] = ()) -> list[str]:
    """Every summary of a paired run's results (``out``: runs, grid, embedded, pooled, verify_calls,
    affinity), then what was cut to fit its budget."""
    cells = [*out["grid"], *out["embedded"]]
    lines = [
        HEADER,
        f"   (timed runs {out.get('affinity', {}).get('chosen', 'free')}; an A/A row is plain against plain)",
    ]
    lines += [cell_line(row) for row in cells]
    if cells and (worst := worst_line(cells)):
        lines.append(worst)
    lines += loop_lines(out["runs"]) + breakdown_lines(out["runs"])
    lines.append("\n== pooled over cells, Auto / plain: mean [95 % bootstrap interval] (n runs)")
    for row in out.get("pooled", []):
        lines.append(
            f"  {row['model']:20s} {row['what']:40s} {row['ratio']:.3f} [{row['low']:.3f}-{row['high']:.3f}] "
            f"(n = {row['n']}; lowest run {row['lowest']:.2f})"
        )
    for call in out["verify_calls"]:
        if call["width"] == 9:
            lines.append(
                f"{call['shape']} 9 rows: exact {1e3 * call['exact_s']:.1f} ms vs fast {1e3 * call['fast_s']:.1f} ms "
                f"({call['exact_over_fast']:.2f}x)"
                + (f", compiled {1e3 * call['exact_compiled_s']:.1f} ms" if "exact_compiled_s" in call else "")
            )
    return lines + [f"reduced: {cut}" for cut in cuts]
