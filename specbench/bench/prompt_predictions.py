"""The prompt benchmark's speculative methods beside the speedup the cost model predicts for them.

Each specbench speculative run kept its steps (``prompt_runs.STEP_COLUMNS``); ``run_predictions`` sets it
against the specbench plain run of the same prompt and repeat: its measured decode speedup over that run,
and the speedup ``specbench.bench.predictions.with_predictions`` predicts for its steps from the stored cost
profile (d from the run's own drafting seconds, in the plain run's seconds per token). ``group_prediction``
pools a method's runs as the summary pools their tokens and seconds: each run's predicted seconds are its
decode tokens over its predicted speedup, in plain steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from specbench.bench.predictions import prediction_error, with_predictions
from specbench.bench.prompt_runs import PromptRun
from specbench.cost.predict import residual
from specbench.cost.profile import Profile

#: The columns a summary row gains: the measured decode speedup over specbench plain, the predicted one,
#: the residual measured / predicted - 1, the mean absolute residual of the runs, and the mean d of the runs.
SUMMARY_COLUMNS = ("plain_speedup", "predicted_speedup", "residual", "mean_abs_residual", "d")


def no_profile_note(model_name: str, device: str) -> str:
    """What the benchmark says when no cost profile is stored for the model on this device."""
    return (
        f"no stored cost profile for {model_name} on {device}: run `specbench profile {model_name}` to see predictions"
    )


def is_speculative_specbench(row: dict[str, Any]) -> bool:
    """Whether a summary row is specbench with a drafter: one that gets a prediction."""
    return row["engine"] == "specbench" and row["drafter"] != "none"


def _decode(run: PromptRun) -> tuple[float, int]:
    """A specbench run's seconds and tokens after its first token."""
    return run.wall_s - run.first_token_s, max(0, run.new_tokens - 1)


def run_predictions(runs: Sequence[PromptRun], profile: Profile) -> pl.DataFrame:
    """One row per specbench speculative run in a verify mode ``profile`` has: ``method``, ``category``,
    ``decode_tokens``, ``plain_speedup`` (its decode tokens per second over those of the specbench plain run of
    the same prompt and repeat), ``predicted_speedup``, ``residual`` and ``d``, null for a run that kept no
    steps (one saved before runs kept them) or has no plain run beside it (an empty frame for no runs)."""
    plain = {(r.question_key, r.turn, r.repeat): r for r in runs if r.plain_specbench}
    rows, steps = [], []
    for r in runs:
        if not r.speculative_specbench or r.verify not in profile.costs:
            continue
        base = plain.get((r.question_key, r.turn, r.repeat))
        (seconds, tokens), (plain_s, plain_tokens) = _decode(r), _decode(base) if base else (0.0, 0)
        measured = (plain_s / plain_tokens) / (seconds / tokens) if tokens and plain_tokens and seconds > 0 else None
        run = len(rows)
        rows.append(
            {
                "run": run,
                "method": r.method,
                "category": r.category,
                "drafter": r.drafter,
                "verify_mode": r.verify,
                "prompt_tokens": r.prompt_tokens,
                "decode_tokens": tokens,
                "plain_speedup": measured if measured is not None else float("nan"),
                "plain_decode_s": plain_s,
                "plain_decode_tokens": plain_tokens,
            }
        )
        if base and r.steps:
            steps += [{**step, "run": run} for step in r.steps]
    if not rows:
        return pl.DataFrame()
    frame = pl.DataFrame(rows, infer_schema_length=None)
    return with_predictions(frame, pl.DataFrame(steps, infer_schema_length=None), profile, measured="plain_speedup")


def group_prediction(predictions: pl.DataFrame, method: str, category: str | None) -> dict[str, float | None]:
    """``predicted_speedup``, ``mean_abs_residual`` (over the runs) and ``d`` (their mean) of ``method``'s runs
    in ``category`` (None: all); the predicted speedup is their decode tokens over their predicted plain steps.
    All None where a run has no prediction."""
    none = {"predicted_speedup": None, "mean_abs_residual": None, "d": None}
    if not len(predictions):
        return none
    mine = predictions.filter(pl.col("method") == method)
    if category is not None:
        mine = mine.filter(pl.col("category") == category)
    if not len(mine) or mine["predicted_speedup"].is_null().any():
        return none
    timed = mine.filter(pl.col("decode_tokens") > 0)
    if not len(timed) or (timed["predicted_speedup"] <= 0).any():
        return none
    steps = (timed["decode_tokens"] / timed["predicted_speedup"]).sum()
    error = prediction_error(mine)
    return {
        "predicted_speedup": float(timed["decode_tokens"].sum() / steps),
        "mean_abs_residual": error["mean_abs_error"][0] if len(error) and error["predicted_runs"][0] else None,
        "d": float(mine["d"].mean()),
    }


def add_predictions(
    summary: list[dict[str, Any]], runs: Sequence[PromptRun], profile: Profile | None
) -> list[dict[str, Any]]:
    """``summary``'s rows (``summarize_prompt_runs``) with ``SUMMARY_COLUMNS``: each method's decode speedup over
    specbench plain in its category, and for speculative methods with ``profile`` the prediction and residual
    (None without a profile, for a verify mode it lacks, or for runs that kept no steps)."""
    plain = {r["category"]: r for r in summary if r["engine"] == "specbench" and r["drafter"] == "none"}
    predictions = run_predictions(runs, profile) if profile is not None else pl.DataFrame()
    for row in summary:
        base = plain.get(row["category"])
        measured = (
            row["decode_tokens_per_s"] / base["decode_tokens_per_s"]
            if base is not None and base["decode_tokens_per_s"] > 0 and row["engine"] == "specbench"
            else None
        )
        category = None if row["category"] == "overall" else row["category"]
        predicted = group_prediction(predictions, row["method"], category) if is_speculative_specbench(row) else {}
        row["plain_speedup"] = measured
        row["predicted_speedup"] = predicted.get("predicted_speedup")
        p = row["predicted_speedup"]
        row["residual"] = residual(measured, p) if measured is not None and p is not None else None
        row["mean_abs_residual"] = predicted.get("mean_abs_residual")
        row["d"] = predicted.get("d")
    return summary
