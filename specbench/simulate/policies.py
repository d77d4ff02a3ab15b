"""Draft-length policies replayed on the same recorded outputs, ranked per workload by predicted speedup.

Each (workload, policy) runs the real decode loop over a workload's recorded greedy outputs (``simulate``),
with a fresh drafter per trace and a fresh policy per workload; its steps are priced with a stored cost profile
(``predicted_speedup``, ``tokens="emitted"``). What ``specbench simulate --policies`` and the policies notebook run.
"""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from specbench.common.files import PROJECT_ROOT
from specbench.core.log import StepLog
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.cost import Profile, drafter_cost, predicted_speedup
from specbench.inputs.prompts import Prompt, prompts_from
from specbench.simulate.simulate import Group, Recorded, group_by_trace, model_free_drafter, record, simulate
from specbench.simulate.simulate_logs import load_groups

#: The peers' policies and Auto, as the policies notebook and ``specbench simulate --policies`` name them.
PEER_POLICIES = ("vllm", "sglang", "ollama", "confidence:0.5", "auto", "fixed:4")


def trace_workloads(
    names: Sequence[str], tokenizer: Any, max_turns: int | None = None
) -> tuple[dict[str, list[Group]], int]:
    """One workload per bundled trace file (or log path): its traces' recorded replies tokenized with
    ``tokenizer`` (no model run), at most ``max_turns`` turns per trace; and how many turns had no reply."""
    workloads, skipped = {}, 0
    for name in names:
        groups, left_out = load_groups(name, tokenizer)
        if max_turns:
            groups = [(tid, lambda turns=turns: itertools.islice(turns(), max_turns)) for tid, turns in groups]
        workloads[Path(name).stem] = groups
        skipped += left_out
    return workloads, skipped


def question_prompts(
    questions: str | os.PathLike,
    tokenizer: Any,
    categories: Sequence[str] | None = None,
    per_category: int = 2,
    max_prompt_tokens: int | None = None,
) -> tuple[list[Prompt], str]:
    """The first ``per_category`` questions of each category of a Spec-Bench ``question.jsonl`` (a relative
    path is read from the project root) and the workloads' name, "spec-bench"; where the file is absent, the
    bundled prompts (Spec-Bench's categories and prompt lookup's workloads) and "bundled", with a message."""
    path = Path(questions)
    path = path if path.is_absolute() else PROJECT_ROOT / path
    source, name = (path, "spec-bench") if path.is_file() else ("bundled", "bundled")
    if name == "bundled":
        print(f"no Spec-Bench questions at {questions}: the bundled prompts stand in for them")
    prompts = prompts_from(source, tokenizer, list(categories or []) or None, per_category, True, max_prompt_tokens)
    return prompts, name


def record_workloads(
    model: Any, prompts: Sequence[Prompt], options: GenerateOptions, name: str, tokenizer: Any = None
) -> tuple[dict[str, list[Group]], list[Recorded]]:
    """The model's plain greedy outputs of ``prompts`` (``record``), one workload per category named
    "NAME/CATEGORY" (its requests in turn, one drafter), and every recorded request (ids "CATEGORY/ID")."""
    recorded = record(model, [p.ids for p in prompts], options, tokenizer)
    requests = [replace(r, id=f"{p.category}/{p.id}") for r, p in zip(recorded, prompts)]
    workloads = {f"{name}/{c}": [(c, lambda rs=rs: rs)] for c, rs in group_by_trace(requests)}
    return workloads, requests


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
        for step in simulate(list(requests()), model_free_drafter(drafter, k), policy, cost=profile).records:
            log.append(step.labelled(trace=trace_id))
    return log


#: The step log's totals a replayed policy's row carries, before its predicted speedup.
POLICY_STATS = ("tokens", "steps", "verifies", "drafted", "accepted", "acceptance_rate", "tokens_per_verify")
#: The verify mode the replays run in (greedy) and are priced in.
MODE = "exact"


def check_widths(log: StepLog, profile: Profile, policy: str, mode: str = MODE) -> None:
    """A ValueError naming the profile's file when a replayed verification is wider than the widths the profile
    measured: its cost would be extrapolated, not measured."""
    widest = max((int(r.verify_width) for r in log.records if r.kind == "verify"), default=0)
    measured = max(profile.widths[mode])
    if widest > measured:
        where = profile.source or profile.name
        raise ValueError(
            f"policy {policy} verified {widest} tokens at once, but the cost profile {where} measured {mode} "
            f"widths up to {measured} only: measure wider (specbench profile --widths {widest}) or draft fewer tokens"
        )


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
    profile.curve(MODE)  # a profile without the replays' verify mode fails here, naming its file
    d = drafter_cost(model_free_drafter(drafter, 1), profile)
    rows, steps = [], StepLog()
    for workload, groups in workloads.items():
        for policy in policies:
            log = replay_policy(groups, policy, profile, drafter, k)
            name = policy if isinstance(policy, str) else policy.name
            check_widths(log, profile, name)
            stats = log.stats()
            predicted = predicted_speedup(log.records, profile, d, mode=MODE, tokens="emitted")
            totals = {key: stats[key] for key in POLICY_STATS} | {"predicted_speedup": predicted}
            rows.append({"workload": workload, "policy": name, "drafter": drafter, **totals})
            steps.records.extend(
                replace(r, policy=name, labels={**r.labels, "workload": workload}) for r in log.records
            )
    table = pl.DataFrame(rows).with_columns(
        pl.col("predicted_speedup").rank("ordinal", descending=True).over("workload").cast(pl.Int64).alias("rank")
    )
    return table.sort("workload", "rank"), steps


def best_predicted(table: pl.DataFrame, workload: str) -> list[str]:
    """The policies of ``workload`` with its highest predicted speedup; none where every policy ties."""
    rows = table.filter(pl.col("workload") == workload)
    top = rows["predicted_speedup"].max()
    best = rows.filter(pl.col("predicted_speedup") >= top - 1e-9)["policy"].to_list()
    return [] if len(best) == len(rows) else best


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
