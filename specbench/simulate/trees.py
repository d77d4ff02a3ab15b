"""Token trees against paths: the same drafter drafting paths or trees, replayed over recorded outputs.

Acceptance under greedy verification is fixed by the greedy output, so the simulator
(``specbench.simulate.simulate``) measures what a tree buys per verification exactly, with no
model run: accepted tokens per verification, and tokens per verification against the node budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from specbench.core.draft import Drafter
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.simulate.simulate import Recorded, group_by_trace, record, simulate

#: Drafters compared as path and as tree (the tree is the drafter's ``tree=True``; "suffix-reference"
#: is SuffixDecoding with the reference's tree from one match, ``tree="reference"``).
TREE_DRAFTERS = ("suffix", "lookup")
ALL_TREE_DRAFTERS = ("suffix", "suffix-reference", "lookup")


def tree_drafter(name: str, tree: bool, budget: int) -> Drafter:
    """A fresh model-free drafter ``name`` (of ``ALL_TREE_DRAFTERS``) drafting paths or trees of ``budget`` nodes."""
    from specbench.drafters import PromptLookup, SuffixDecoding

    if name == "suffix":
        return SuffixDecoding(max_spec_tokens=budget, tree=tree)
    if name == "suffix-reference":
        return SuffixDecoding(max_spec_tokens=budget, tree="reference" if tree else False)
    if name == "lookup":
        return PromptLookup(preferred_k=budget, tree=tree)
    raise ValueError(f"tree comparison drafters are {', '.join(ALL_TREE_DRAFTERS)}; got {name!r}")


def record_groups(
    model: Any, tokenizer: Any, groups: Sequence[tuple[str, Callable[[], Iterable[Recorded]]]], max_tokens: int
) -> list[Recorded]:
    """The model's greedy outputs (at most ``max_tokens`` each) for every turn's prompt of ``groups``
    (``simulate.trace_groups``), ids ``trace/turn`` kept."""
    requests = [request for _, turns in groups for request in turns()]
    recorded = record(model, [r.prompt for r in requests], GenerateOptions(max_tokens=max_tokens), tokenizer)
    return [replace(r, id=request.id) for r, request in zip(recorded, requests)]


def compare_trees(
    requests: Sequence[Recorded],
    drafters: Sequence[str] = TREE_DRAFTERS,
    budgets: Sequence[int] = (8, 16),
):
    """Every (trace, drafter, budget) as path and as tree, over recorded greedy outputs grouped by trace
    (one drafter per drafter, mode and budget across the traces in order: SuffixDecoding's store is
    shared). One row each: verifications, accepted tokens, accepted tokens and tokens per
    verification, mean nodes verified, and the share of verifications that drafted a tree."""
    import polars as pl

    if not budgets or any(not isinstance(b, int) or b < 1 for b in budgets):
        raise ValueError(f"node budgets must be integers >= 1, got {list(budgets)}")
    groups = group_by_trace(requests)
    rows = []
    for name in drafters:
        for budget in budgets:
            for tree in (False, True):
                drafter = tree_drafter(name, tree, budget)
                for trace, turns in groups:
                    log = simulate(turns, drafter, DraftPolicy.fixed(budget))
                    stats = log.stats()
                    n = max(stats["verifies"], 1)
                    rows.append(
                        {
                            "trace": trace,
                            "drafter": name,
                            "mode": "tree" if tree else "path",
                            "budget": budget,
                            **{key: stats[key] for key in ("tokens", "verifies", "accepted")},
                            "accepted_per_verify": stats["accepted"] / n,
                            "tokens_per_verify": stats["tokens_per_verify"],
                            "nodes_per_verify": stats["drafted"] / n,
                            "tree_share": sum(r.tree_nodes > 0 for r in log.records if r.kind == "verify") / n,
                        }
                    )
    return pl.DataFrame(rows)


def tree_gain(table) -> Any:
    """``compare_trees``' rows side by side: path and tree accepted tokens per verification and their ratio."""
    import polars as pl

    keys = ["trace", "drafter", "budget"]
    path = table.filter(pl.col("mode") == "path").select(*keys, path=pl.col("accepted_per_verify"))
    tree = table.filter(pl.col("mode") == "tree").select(
        *keys, tree=pl.col("accepted_per_verify"), tree_nodes=pl.col("nodes_per_verify")
    )
    joined = path.join(tree, on=keys)
    return joined.with_columns(ratio=pl.col("tree") / pl.col("path")).sort(keys)


def tokens_by_budget(table, drafter: str, mode: str = "tree") -> dict[int, float]:
    """``compare_trees``' tokens per verification of ``drafter`` in ``mode`` for each node budget, pooled over
    traces (verifications weighted): what ``AutoPolicy.choose_node_budget`` chooses from."""
    import polars as pl

    rows = table.filter((pl.col("drafter") == drafter) & (pl.col("mode") == mode))
    pooled = rows.group_by("budget").agg((pl.col("accepted") + pl.col("verifies")).sum() / pl.col("verifies").sum())
    return {int(b): float(t) for b, t in pooled.iter_rows() if t == t}
