"""Draft-length policies replayed on the same recorded outputs, ranked per workload by predicted speedup.

Each (workload, policy) runs the real decode loop over a workload's recorded plain greedy outputs
(``simulate``, no model run), with a fresh model-free drafter per trace and a fresh policy per workload (a
policy's state carries over a workload's requests, as a server's would). The predicted speedup prices the
steps the policy took with a stored cost profile: decode tokens over the sum of c(width) + drafted x d, in
plain steps (``specbench.cost.predicted_from_log``). What ``specbench simulate --policies`` and the policies
notebook run.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from specbench.core.log import StepLog
from specbench.core.policies import DraftPolicy
from specbench.cost import Profile, drafter_cost, predicted_from_log
from specbench.simulate.simulate import Group, model_free_drafter, simulate

#: The peers' policies and Auto, as the policies notebook and ``specbench simulate --policies`` name them.
PEER_POLICIES = ("vllm", "sglang", "ollama", "confidence:0.5", "auto", "fixed:4")


def read_profile(path: str | os.PathLike) -> Profile:
    """A cost profile from its JSON file (as ``specbench.cost.save_profile`` stores it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no cost profile at {path}: give a profile's JSON (under $SPECBENCH_HOME/profiles)")
    try:
        return Profile.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path} is not a cost profile: {err}") from err


def policy_copy(policy: DraftPolicy | str) -> DraftPolicy:
    """A fresh policy: text parsed anew, an object deep-copied (its state is its own)."""
    return DraftPolicy.parse(policy) if isinstance(policy, str) else copy.deepcopy(policy)


def replay_policy(
    groups: Sequence[Group], policy: DraftPolicy | str, profile: Profile, drafter: str = "lookup", k: int = 8
) -> StepLog:
    """One policy over a workload's traces (a fresh drafter per trace): every step, with a ``trace`` column."""
    policy = policy_copy(policy)
    log = StepLog()
    for trace_id, requests in groups:
        for record in simulate(list(requests()), model_free_drafter(drafter, k), policy, cost=profile).records:
            log.append(record.labelled(trace=trace_id))
    return log


def policy_row(log: StepLog, profile: Profile, drafter: str, mode: str = "exact") -> dict[str, Any]:
    """A replayed policy's totals and its predicted speedup on ``profile`` (in the simulator's verify mode)."""
    stats = log.stats()
    d = drafter_cost(model_free_drafter(drafter, 1), profile)
    return {
        "tokens": stats["tokens"],
        "steps": stats["steps"],
        "verifies": stats["verifies"],
        "drafted": stats["drafted"],
        "accepted": stats["accepted"],
        "acceptance_rate": stats["acceptance_rate"],
        "tokens_per_verify": stats["tokens_per_verify"],
        "predicted_speedup": predicted_from_log(log.records, profile, d, mode),
    }


def rank_policies(
    workloads: Mapping[str, Sequence[Group]],
    policies: Sequence[DraftPolicy | str],
    profile: Profile,
    drafter: str = "lookup",
    k: int = 8,
) -> tuple[pl.DataFrame, StepLog]:
    """Every policy on every workload: one row per (workload, policy) with its predicted speedup and its
    ``rank`` within the workload (1: the highest), and every step with workload and policy columns."""
    if not policies:
        raise ValueError(f"give at least one policy (e.g. {', '.join(PEER_POLICIES)})")
    for policy in policies:
        policy_copy(policy)  # a bad name fails here, before any replay
    rows, steps = [], StepLog()
    for workload, groups in workloads.items():
        for policy in policies:
            log = replay_policy(groups, policy, profile, drafter, k)
            name = policy if isinstance(policy, str) else policy.name
            rows.append({"workload": workload, "policy": name, "drafter": drafter, **policy_row(log, profile, drafter)})
            steps.records.extend(
                replace(r, policy=name, labels={**r.labels, "workload": workload}) for r in log.records
            )
    table = pl.DataFrame(rows).with_columns(
        pl.col("predicted_speedup").rank("ordinal", descending=True).over("workload").cast(pl.Int64).alias("rank")
    )
    return table.sort("workload", "rank"), steps


def format_ranking(table: pl.DataFrame) -> str:
    """The ranking as a text table: per workload, each policy's predicted speedup and acceptance."""
    lines = [f"{'workload':22s} {'rank':>4s} {'policy':24s} {'predicted':>9s} {'tok/verify':>10s} {'accept':>6s}"]
    for r in table.iter_rows(named=True):
        lines.append(
            f"{r['workload']:22s} {r['rank']:4d} {r['policy']:24s} {r['predicted_speedup']:8.2f}x "
            f"{r['tokens_per_verify']:10.2f} {r['acceptance_rate']:6.2f}"
        )
    return "\n".join(lines)


def top_policies(table: pl.DataFrame, n: int = 2) -> list[str]:
    """The ``n`` policies with the best mean rank over the workloads (ties: the higher mean prediction)."""
    means = table.group_by("policy").agg(pl.col("rank").mean(), pl.col("predicted_speedup").mean())
    return means.sort(["rank", "predicted_speedup"], descending=[False, True])["policy"].head(n).to_list()
