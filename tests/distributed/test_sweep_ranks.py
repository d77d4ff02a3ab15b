"""A sweep spread over 2 local ranks (ring backend) writes the same merged results as one rank, and an
interrupted distributed sweep resumes: finished cells are read back, the missing one is run again."""

from __future__ import annotations

import polars as pl
from launching import HERE, launch_ranks
from sweep_ranks import sweep

RUN_COLUMNS = [
    "run",
    "prompt",
    "temperature",
    "seed",
    "drafter",
    "policy",
    "tokens",
    "decode_tokens",
    "steps",
    "verifies",
    "drafted",
    "accepted",
    "equal_to_plain",
    "finish_reason",
]
STEP_COLUMNS = ["run", "step", "kind", "position", "emitted", "accepted", "tokens"]


def test_two_rank_sweep_equals_one_rank_and_resumes(tmp_path):
    launch_ranks(HERE / "sweep_ranks.py", tmp_path / "ranks")
    single = sweep(tmp_path / "single")
    merged = pl.read_parquet(tmp_path / "ranks" / "sweep" / "sweep-runs.parquet")
    steps = pl.read_parquet(tmp_path / "ranks" / "sweep" / "sweep-steps.parquet")
    assert merged.height == single.runs.height == 4 * 3
    assert merged.select(RUN_COLUMNS).equals(single.runs.select(RUN_COLUMNS))
    assert steps.select(STEP_COLUMNS).equals(single.steps.select(STEP_COLUMNS))
    assert merged.filter(pl.col("temperature") == 0)["equal_to_plain"].drop_nulls().all()

    resumed = pl.read_parquet(tmp_path / "ranks" / "resumed" / "sweep-runs.parquet")
    assert resumed.select(RUN_COLUMNS).equals(merged.select(RUN_COLUMNS))
    # Cells read back keep their clocks; only the removed cell (plain + 2 speculative runs) ran again.
    rerun = resumed.filter(pl.col("decode_s") != merged["decode_s"])
    assert 1 <= rerun.height <= 3 and rerun["prompt"].n_unique() == 1
