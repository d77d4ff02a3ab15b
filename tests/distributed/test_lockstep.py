"""Speculation on a model sharded over 2 local ranks (ring backend): greedy output equals plain greedy
on the same sharded model, every rank produces the same tokens, rank 0 alone writes files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launching import HERE, launch_ranks

#: Deadlock-free and exact on either BLAS: make test runs it on the optimized BLAS and again on the reference one.
pytestmark = pytest.mark.reference_blas


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("lockstep")
    launch_ranks(HERE / "lockstep_ranks.py", out)
    return [json.loads((out / f"rank{r}.json").read_text()) | {"out": str(out)} for r in range(2)]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_sharded_speculative_greedy_equals_sharded_plain(ranks, arch):
    for result in ranks:
        assert result["size"] == 2 and result["backend"] == "ring"
        run = result[arch]
        assert run["sharded"] == [2, "ring"]
        assert run["plain"] == run["mlx_lm"]  # the engine's plain decoding is mlx-lm's, sharded
        cases = [c for c in run if c.startswith(("noisy", "lookup"))]
        assert cases
        for case in cases:
            assert run[case]["tokens"] == run["plain"], (arch, case, result["rank"])
        for mode in ("exact", "fast"):  # drafts partly accepted: both outcomes of verification exercised
            noisy = run[f"noisy-{mode}"]
            assert noisy["verifies"] > 0 and 0 < noisy["accepted"] < noisy["drafted"]


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_every_rank_produces_the_same_tokens(ranks, arch):
    """The drafter draws its wrong positions (and q) from a generator seeded by the rank: only rank 0's
    drafts, broadcast, keep the ranks' sampled outputs equal."""
    first, second = (r[arch] for r in ranks)
    assert first == second
    assert first["sampled"]["verifies"] > 0


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_ranks_whose_probes_disagree_calibrate_alike(ranks, arch):
    """Rank 1 finds the batched forward inexact and every level's cost reversed (lockstep_ranks.py): the ranks
    still calibrated every width the exact run needs, to one level each, and none runs the batched forward."""
    first, second = (r[arch]["calibration"] for r in ranks)
    assert first == second and sorted(first) == ["2", "3", "4"]
    assert "none" not in first.values()


def test_a_sweep_of_a_sharded_model_runs_in_lockstep(ranks):
    assert ranks[0]["sweep"] == ranks[1]["sweep"] and len(ranks[0]["sweep"]) == 2


def test_rank_zero_alone_writes(ranks):
    """Exact-mode calibrations went to each rank's own SPECBENCH_HOME: rank 0's holds them, rank 1's none."""
    out = Path(ranks[0]["out"])
    assert list((out / "home0" / "exact").glob("*.json"))
    assert not list((out / "home1").rglob("*.json"))  # (a lock file may be there)
