"""The prompt benchmark's speculative methods beside the speedup the cost model predicts for them: each run
against the specbench plain run of its prompt and repeat (``run_predictions``), pooled per method and category
as the summary pools tokens and seconds (``group_prediction``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from specbench.bench.predictions import prediction_error, with_predictions
from specbench.bench.prompt_runs import PromptRun
from specbench.cost.profile import Profile


def no_profile_note(model_name: str, device: str) -> str:
    """What the benchmark says when no cost profile is stored for the model on this device."""
    return (
        f"no stored cost profile for {model_name} on {device}: run `specbench profile {model_name}` to see predictions"
    )


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


@dataclass(frozen=True)
class GroupPrediction:
    """A method's runs in a category pooled (``group_prediction``): the predicted speedup, the mean absolute
    residual over the runs and their mean d; all None where a run has no prediction."""

    predicted_speedup: float | None = None
    mean_abs_residual: float | None = None
    d: float | None = None


NO_PREDICTION = GroupPrediction()


def group_prediction(predictions: pl.DataFrame, method: str, category: str | None) -> GroupPrediction:
    """``method``'s runs in ``category`` (None: all) pooled: the predicted speedup is their decode tokens over
    their predicted plain steps."""
    if not len(predictions):
        return NO_PREDICTION
    mine = predictions.filter(pl.col("method") == method)
    if category is not None:
        mine = mine.filter(pl.col("category") == category)
    timed = mine.filter(pl.col("decode_tokens") > 0)
    predicted = pl.col("predicted_speedup")
    if not len(timed) or mine.select(predicted.is_null().any()).item() or timed.select((predicted <= 0).any()).item():
        return NO_PREDICTION
    pooled = timed.select(pl.col("decode_tokens").sum() / (pl.col("decode_tokens") / predicted).sum()).item()
    error, runs = prediction_error(mine).row(0)
    return GroupPrediction(float(pooled), error if runs else None, float(mine.select(pl.col("d").mean()).item()))
