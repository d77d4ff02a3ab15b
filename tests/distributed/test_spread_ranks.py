"""``specbench report`` and ``specbench bench prompts`` spread over 2 local ranks (ring backend), each rank
with an output folder of its own as on two machines: rank 0's folder ends with the same files, statuses, runs
and summaries as a one-rank run (modulo timings), and an interrupted run resumes there."""

from __future__ import annotations

import json

import polars as pl
import pytest
from launching import HERE, launch_ranks
from prompt_bench_ranks import RUNS, bench
from report_ranks import NOTEBOOKS, report, write_notebooks

from specbench.report import runner

#: Status keys that differ from run to run (clocks, process).
STATUS_TIMED = {"started", "finished", "seconds", "cpu_s", "pid", "host"}
#: Bench columns that hold clocks (and the configuration, which holds the device's name; the steps, drafting seconds).
TIMED = {"config", "wall_s", "first_token_s", "tokens_per_s", "steps"}
SUMMARY_TIMED = {"seconds", "tokens_per_s", "decode_tokens_per_s", "speedup", "decode_speedup"}
SUMMARY_TIMED |= {"speedup_min", "speedup_max", "speedup_low", "speedup_high"}
SUMMARY_TIMED |= {"plain_speedup", "predicted_speedup", "residual", "mean_abs_residual", "d"}
#: One bench row per question, turn, repeat and method (each rank rotates the methods' order on its own).
KEY = ["question_key", "turn", "repeat", "method"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """The folder the two ranks of spread_ranks.py wrote (report/ and bench/, the ranks' logs)."""
    root = tmp_path_factory.mktemp("ranks")
    launch_ranks(HERE / "spread_ranks.py", root)
    return root


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))


def _untimed(frame: pl.DataFrame, timed: set[str], key: list[str]) -> pl.DataFrame:
    return frame.select([c for c in frame.columns if c not in timed]).sort(key, maintain_order=True)


def test_two_rank_report_equals_one_rank_and_resumes(ranks, tmp_path):
    results = [json.loads((ranks / "report" / f"result{r}.json").read_text()) for r in range(2)]
    merged, single = ranks / "report" / "host0" / "report", tmp_path / "single"
    assert report(single, write_notebooks(tmp_path / "notebooks")) == dict.fromkeys(NOTEBOOKS, "done")

    # Each rank ran one notebook (its share by expected seconds); both ranks hold every result.
    assert [r["held"] for r in results] == [NOTEBOOKS, ["batch_break_even"]]
    assert results[0]["first"] == results[1]["first"] == dict.fromkeys(NOTEBOOKS, "done")
    assert _files(merged) == _files(single)
    for name in NOTEBOOKS:
        got, want = runner.read_status(merged, name), runner.read_status(single, name)
        assert {k: v for k, v in got.items() if k not in STATUS_TIMED} == {
            k: v for k, v in want.items() if k not in STATUS_TIMED
        }
        for same in (f"{name}/tables/numbers.csv", f"{name}/summary.json"):
            assert (merged / same).read_text() == (single / same).read_text()
        assert f"{name}/tables/numbers.csv" in got["outputs"]
    page = (merged / "index.html").read_text()
    assert all(f'href="{name}.html"' in page for name in NOTEBOOKS) and 'class="not run"' not in page

    # Resumed after rank 0's folder lost one notebook's HTML and rank 1's folder everything: rank 0's folder
    # decides, so only that notebook runs again (on rank 0, the lightest share), and nothing on rank 1.
    assert results[0]["second"] == results[1]["second"] == {"batch_break_even": "skipped", "tree_vs_path": "done"}
    assert [r["held_after"] for r in results] == [NOTEBOOKS, []]
    assert _files(merged) == _files(single)


def test_two_rank_bench_equals_one_rank_and_resumes(ranks, tmp_path):
    merged, single = ranks / "bench" / "host0" / "bench", tmp_path / "single"
    assert bench(single) == 0
    assert sorted(p.name for p in merged.iterdir()) == sorted(p.name for p in single.iterdir())
    left = [json.loads((ranks / "bench" / f"left{r}.json").read_text()) for r in range(2)]
    assert left == [sorted(p.name for p in single.iterdir()), []]  # each rank's progress went with the merge

    first, want = pl.read_parquet(ranks / "bench" / "first-runs.parquet"), pl.read_parquet(single / RUNS)
    assert first.columns == want.columns and first.height == want.height == 4 * 3
    assert _untimed(first, TIMED, KEY).equals(_untimed(want, TIMED, KEY))
    assert first["question_key"].unique(maintain_order=True).equals(want["question_key"].unique(maintain_order=True))
    assert first["equal"].all()

    summary, want_summary = (pl.read_parquet(f / "prompt_bench_summary.parquet") for f in (merged, single))
    assert summary.columns == want_summary.columns
    key = ["category", "method"]
    assert _untimed(summary, SUMMARY_TIMED, key).equals(_untimed(want_summary, SUMMARY_TIMED, key))
    table = (merged / "prompt_bench.md").read_text()
    assert "Spread over 2 ranks" in table and "Spread over" not in (single / "prompt_bench.md").read_text()
    logs = [(ranks / f"rank{r}.log").read_text() for r in range(2)]
    assert "Spread over 2 ranks" in logs[0] and "Overall:" not in logs[1]  # rank 0 alone prints the results

    # Resumed after rank 0's results lost the multi-turn question: it alone ran again, the rest kept their clocks.
    resumed = pl.read_parquet(merged / RUNS)
    assert _untimed(resumed, TIMED, KEY).equals(_untimed(first, TIMED, KEY))
    rerun = resumed.join(first, on=KEY, suffix="_first").filter(pl.col("wall_s") != pl.col("wall_s_first"))
    assert set(rerun["category"]) == {"multi_turn"} and rerun.height == 2 * 3
    # A rank that could not run its share stopped both ranks with one error naming it (and left the results).
    assert "error: rank 1 failed: ValueError:" in logs[0] and "another benchmark configuration" in logs[0]
    assert "holds results of another benchmark configuration" in logs[1]
    assert _untimed(pl.read_parquet(merged / RUNS), TIMED, KEY).equals(_untimed(first, TIMED, KEY))


def test_report_starts_its_own_local_ranks(tmp_path):
    """``specbench report --ranks 2`` starts two ring ranks itself (no launcher): one notebook on each, rank 0
    prints every result, rank 1's console goes to rank1.log in the report folder; a rank count below 1 is
    refused before anything runs."""
    import os
    import subprocess
    import sys

    notebooks, out = write_notebooks(tmp_path / "notebooks"), tmp_path / "out"
    command = [sys.executable, "-m", "specbench", "report", "--profile", "quick", "--notebooks", str(notebooks)]
    command += ["--out", str(out), "-p", "value=5", *(f"--only={name}" for name in NOTEBOOKS)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([*command, "--ranks", "2"], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert [runner.read_status(out, name)["status"] for name in NOTEBOOKS] == ["done", "done"]
    assert "report on 2 ranks" in done.stdout and all(f"  {name}" in done.stdout for name in NOTEBOOKS)
    ran = {name: f"{name}: done in" for name in NOTEBOOKS}
    rank0, rank1 = done.stdout + done.stderr, (out / "rank1.log").read_text()
    assert [name for name in NOTEBOOKS if ran[name] in rank0] == ["tree_vs_path"]  # each rank ran one of them
    assert [name for name in NOTEBOOKS if ran[name] in rank1] == ["batch_break_even"]
    refused = subprocess.run([*command, "--ranks", "0"], capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode != 0 and "--ranks must be at least 1, got 0" in refused.stderr
