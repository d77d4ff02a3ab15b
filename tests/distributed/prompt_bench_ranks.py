"""``specbench bench prompts`` on a miniature model, run on 2 ranks by tests/distributed/spread_ranks.py (each
rank with an ``--out`` of its own, as on two machines, merged into rank 0's; then again after rank 0's results
lost one question, and once more with a rank that cannot run) and in a world of one by the test itself."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from specbench.cli import main
from specbench.common import distributed

RUNS = "prompt_bench_runs.parquet"


def bench(out: Path) -> int:
    """Three questions (one of two turns), plain mlx-lm, specbench and lookup fixed:2, 8 tokens each."""
    return main(
        ["bench", "prompts", "bundled", "--model", "tiny:smollm2-135m", "--categories", "qa,translation,multi_turn"]
        + ["--limit", "1", "--max-tokens", "8", "--drafters", "lookup", "--policies", "fixed:2", "--verify", "fast"]
        + ["--out", str(out)]
    )


def run_on_ranks(root: Path) -> None:
    """The benchmark on this rank, then again after rank 0's results lost a question (the first results are kept
    in ``ROOT/first-runs.parquet``)."""
    out = root / f"host{distributed.rank()}" / "bench"
    assert bench(out) == 0
    if distributed.is_main():  # keep the first results; then lose the multi-turn question's runs
        (out / RUNS).rename(root / "first-runs.parquet")
        runs = pl.read_parquet(root / "first-runs.parquet")
        runs.filter(pl.col("category") != "multi_turn").write_parquet(out / RUNS)
    distributed.barrier()
    assert bench(out) == 0
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    (root / f"left{distributed.rank()}.json").write_text(json.dumps(left))
    # A rank that cannot run its share (here: rank 1's progress is of another configuration) stops every rank.
    if not distributed.is_main():
        part = out / ".ranks" / "rank1of2" / RUNS
        part.parent.mkdir(parents=True)
        pl.read_parquet(root / "first-runs.parquet").with_columns(config=pl.lit("another")).write_parquet(part)
    assert bench(out) == 2
