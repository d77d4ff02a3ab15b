"""Outside a launcher: the group is a world of one and every distributed helper is a no-op; loading
sharded checks the family and the head counts; rank 0 alone writes in lockstep."""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import build_tiny
from mlx.utils import tree_flatten

from specbench.common import distributed
from specbench.common.files import write_text_atomic
from specbench.common.identity import model_key
from specbench.core.draft import Draft, Drafter
from specbench.core.lockstep import RankZeroDrafter, RankZeroPolicy, in_lockstep
from specbench.core.policies import DraftPolicy, Speculate
from specbench.models.load import shard_model, shardable_families


def test_world_of_one(monkeypatch):
    for name in ("MLX_RANK", "MLX_HOSTFILE", "NCCL_HOST_IP", "MLX_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert distributed.launched_backend() is None
    assert (distributed.rank(), distributed.size(), distributed.is_main()) == (0, 1, True)
    assert distributed.backend() == "single"
    q = mx.ones((2, 3))
    assert distributed.broadcast({"tokens": [1, 2], "q": q})["q"] is q
    assert distributed.broadcast_array(q, (2, 3), mx.float32) is q
    assert distributed.gather(7) == [7]
    distributed.barrier()
    assert distributed.writes_here() and not distributed.lockstep()


def test_launched_backend_from_the_environment(monkeypatch):
    for name in ("MLX_RANK", "MLX_HOSTFILE", "NCCL_HOST_IP", "MLX_WORLD_SIZE", "MLX_JACCL_COORDINATOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLX_RANK", "1")
    monkeypatch.setenv("MLX_HOSTFILE", "/tmp/hosts.json")
    assert distributed.launched_backend() == "ring"
    monkeypatch.setenv("NCCL_HOST_IP", "127.0.0.1")
    monkeypatch.setenv("MLX_WORLD_SIZE", "2")
    assert distributed.launched_backend() == "nccl"


def test_shard_is_a_no_op_in_a_world_of_one():
    model = build_tiny("qwen3_moe")
    before = {k: v.shape for k, v in tree_flatten(model.parameters())}
    key = model_key(model)
    assert shard_model(model, "tiny") is model
    assert {k: v.shape for k, v in tree_flatten(model.parameters())} == before
    assert not distributed.is_sharded(model) and model_key(model) == key
    model.specbench_group = (2, "ring")
    assert model_key(model) == key + "-tp2-ring"  # profiles and calibrations of a sharded model are its own


def test_shard_errors_name_the_problem(monkeypatch):
    class NoShard(nn.Module):
        pass

    with pytest.raises(ValueError, match="no tensor-parallel shard.*qwen3"):
        shard_model(NoShard(), "plain-module")
    assert {"llama", "qwen3", "qwen3_moe"} <= set(shardable_families())
    monkeypatch.setattr(distributed, "size", lambda: 3)
    with pytest.raises(ValueError, match="4 heads attention heads, not a multiple of 3"):
        shard_model(build_tiny("qwen3"), "tiny qwen3")


def test_rank_zero_alone_writes_in_lockstep(tmp_path, monkeypatch):
    monkeypatch.setitem(distributed._state, "lockstep", True)
    monkeypatch.setattr(distributed, "size", lambda: 2)
    monkeypatch.setattr(distributed, "rank", lambda: 1)
    assert not distributed.writes_here()
    write_text_atomic(tmp_path / "log.txt", "x")
    assert not (tmp_path / "log.txt").exists()
    monkeypatch.setattr(distributed, "rank", lambda: 0)
    write_text_atomic(tmp_path / "log.txt", "x")
    assert (tmp_path / "log.txt").exists()


def test_lockstep_wrappers_pass_through_in_a_world_of_one():
    class Fixed(Drafter):
        name, preferred_k = "fixed-draft", 3

        def draft(self, context, k):
            return Draft([1, 2, 3, 4][:k])

    drafter, policy = Fixed(), DraftPolicy.fixed(2)
    assert in_lockstep(drafter, policy) == (drafter, policy)
    wrapped, rank_zero = RankZeroDrafter(drafter), RankZeroPolicy(DraftPolicy.auto(break_even=1.5))
    assert wrapped.draft([0], 2).tokens == [1, 2] and wrapped.preferred_k == 3 and wrapped.name == "fixed-draft"
    rank_zero.start(wrapped)
    assert rank_zero.name == "auto" and rank_zero.decide(_EmptyLog(), wrapped) == Speculate(3)


class _EmptyLog:
    records: list = []


def test_shard_flag_on_the_commands_that_load_a_target(capsys):
    from specbench.cli import main

    commands = (("generate",), ("profile",), ("bench", "prompts"), ("bench", "trace"), ("train-mtp",))
    for command, has_flag in zip(commands, (True, True, True, True, False), strict=True):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        assert ("--shard" in capsys.readouterr().out) == has_flag, command


def test_split_balances_shares_by_weight():
    assert distributed.split([60, 50, 60], 2) == [[0, 1], [2]]  # heaviest first, to the lightest share
    assert distributed.split([1, 1, 1, 1], 1) == [[0, 1, 2, 3]] and distributed.split([], 2) == [[], []]
    assert distributed.split([5, 1, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4, 5]]
    weights = [float(w) for w in np.random.default_rng(0).integers(1, 100, size=40)]
    shares = distributed.split(weights, 3)
    assert sorted(i for share in shares for i in share) == list(range(40))
    loads = [sum(weights[i] for i in share) for share in shares]
    assert max(loads) - min(loads) <= max(weights)
    assert distributed.my_share([3, 2, 1]) == [0, 1, 2]
    with pytest.raises(ValueError, match="parts must be >= 1"):
        distributed.split([1], 0)


def test_gather_outcomes_and_detach_children_in_a_world_of_one(monkeypatch):
    assert distributed.gather_outcomes(lambda: {"rows": [1]}) == [{"rows": [1]}]

    def broken():
        raise KeyError("lost")

    with pytest.raises(KeyError, match="lost"):  # the failing rank raises its own error
        distributed.gather_outcomes(broken)
    distributed.group()
    for name, value in (("MLX_RANK", "1"), ("MLX_HOSTFILE", "h"), ("NCCL_PORT", "1"), ("OMPI_COMM_WORLD_SIZE", "2")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    distributed.detach_children()
    assert distributed.launched_backend() is None and os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert "MLX_RANK" not in os.environ and "NCCL_PORT" not in os.environ


def test_notebooks_reading_the_sweeps_records_run_on_its_rank():
    """Spread over ranks, the sampling and explorer notebooks (which read the sweep's recorded outputs) go in
    the sweep's group, after it; without the sweep running they stand alone."""
    from specbench.common.distributed import split
    from specbench.report.ranks import run_together

    names = ["draft_length_sweep", "quickstart", "sampling", "explorer", "policies"]
    groups = run_together(names)
    assert groups == [["draft_length_sweep", "sampling", "explorer"], ["quickstart"], ["policies"]]
    assert run_together(["quickstart", "explorer"]) == [["quickstart"], ["explorer"]]
    weights = [250 + 75 + 7, 60, 200]  # the sweep's group against the rest: two shares of about equal seconds
    assert split(weights, 2) == [[0], [1, 2]]
