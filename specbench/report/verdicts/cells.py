"""The words for a measured grid of cells beside its predictions (the break-even and batch pages)."""

from __future__ import annotations

import math

import polars as pl

from specbench.cost.predict import mean_absolute_error


def measured_cells(grid: pl.DataFrame, measured: str, predicted: str, residual: str, label: str = "name") -> str:
    """Measured speedups of a grid of cells beside the profile's predictions and their residuals (measured /
    predicted - 1): a test of the predictions, not a speed verdict (a cell's few runs have no interval). Where the
    cells were timed as repeated pairs (``measured_runs``, ``noise_floor``: ``specbench.cost.grid``), the mean
    |residual| is set against what a perfect predictor would miss by at that scatter."""
    residuals = grid[residual].abs()
    below = int((grid[measured] < 1).sum())
    predicted_above = grid.filter((pl.col(predicted) > 1) & (pl.col(measured) < 1))
    pairs = int(grid["measured_runs"].list.len().min()) if "measured_runs" in grid.columns else 1
    timed = "one plain and one speculative run each" if pairs < 2 else f"the median of {pairs} adjacent pairs each"
    text = (
        f"Measured cells ({timed}, no interval, so no speed verdict): "
        f"{grid[measured].min():.2f}-{grid[measured].max():.2f}x, below 1 in {below} of {len(grid)}, against "
        f"predictions of {grid[predicted].min():.2f}-{grid[predicted].max():.2f}x; residual "
        f"(measured / predicted - 1) {grid[residual].mean():+.0%} on average, |residual| up to {residuals.max():.0%}."
    )
    scatter = grid["noise_floor"].to_list() if "noise_floor" in grid.columns else []
    floors = [f for f in scatter if f is not None and math.isfinite(f)]
    if floors:
        floor, error = mean_absolute_error(floors), mean_absolute_error(grid[residual].to_list())
        # a perfect predictor's |residuals| are half-normal: their mean over n cells has a standard deviation of
        # sqrt(pi / 2 - 1) floor / sqrt(n); two of them above the floor is beyond the noise
        reading = (
            "within the noise: the machine cannot tell a better predictor here"
            if error <= floor * (1 + 2 * math.sqrt(math.pi / 2 - 1) / math.sqrt(len(floors)))
            else "beyond the noise: the predictor misses"
        )
        text += (
            f" Mean |residual| {error:.1%} against {floor:.1%} that a perfect predictor would show from the pairs'"
            f" scatter ({reading})."
        )
    if len(predicted_above):
        where_cells = ", ".join(
            f"{r[label]} a = {r.get('a', r.get('acceptance'))}, k = {r['k']}"
            + (f", B = {r['batch_size']}" if "batch_size" in r else "")
            for r in predicted_above.head(4).iter_rows(named=True)
        )
        text += f" Predicted above 1 but measured below: {where_cells}{' ...' if len(predicted_above) > 4 else ''}."
    return text
