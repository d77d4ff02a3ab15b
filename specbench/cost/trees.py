"""Verify cost by node count: a token tree of n nodes against a path of n tokens, in plain steps.

A tree verification is one forward of n + 1 rows (the last emitted token and the nodes) under the
tree mask and per-depth positions (``specbench.core.tree``); a path verification of n tokens is the
same number of rows under the causal mask. ``measure_tree_costs`` times both through the verify
mode's verifier, as ``specbench.cost.measure`` times paths, on a binary tree (node i's parent is
(i - 1) // 2: every depth branches, the deepest tree shape costs no fewer rows). ``tree_break_even``
turns the costs into Auto's break-even of a node budget (``AutoPolicy.choose_node_budget``), and
``best_node_budget`` is the break-even math for measured tokens per verification. Stored per model,
device, versions and verify mode next to the cost profiles.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import generation_stream, wired_limit

from specbench.common.files import home, write_json_atomic
from specbench.common.identity import device_name, model_key, versions
from specbench.core.draft import Drafter
from specbench.core.forward import vocab_size
from specbench.core.options import check_verify_mode
from specbench.core.tree import tree_attention
from specbench.cost.breakeven import drafter_cost
from specbench.cost.caches import CacheRestore, prefill
from specbench.cost.measure import _time_plain
from specbench.cost.profile import _slug
from specbench.exact import verifier_for

NODE_COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


@dataclass
class TreeCosts:
    """c_tree(n) and c_path(n): seconds of verifying n drafted nodes as a tree / as a path over one plain step."""

    model: str
    device: str
    versions: dict[str, str]
    mode: str
    plain_step_s: float
    nodes: list[int]
    tree: list[float]
    path: list[float]
    tree_s: list[float]
    path_s: list[float]
    offset: int = 0
    repeats: int = 0
    created: str = ""

    def c(self, n: int | float, shape: str = "tree") -> float:
        """Cost of verifying ``n`` nodes as ``shape`` ("tree" or "path") in plain steps: linear between
        measured counts, past the largest at the slope of its last two (n = 0: one plain step)."""
        if shape not in ("tree", "path"):
            raise ValueError(f"shape must be 'tree' or 'path', got {shape!r}")
        if n < 0:
            raise ValueError(f"a node count is >= 0, got {n}")
        xs = [0, *self.nodes]
        ys = [1.0, *(self.tree if shape == "tree" else self.path)]
        if n <= xs[-1]:
            return float(np.interp(n, xs, ys))
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(ys[-1] + slope * (n - xs[-1]))

    def path_nodes_at_cost(self, n: int) -> int:
        """The longest path whose verification costs no more than a tree of ``n`` nodes (among measured counts)."""
        limit = self.c(n, "tree")
        return max([m for m, c in zip(self.nodes, self.path) if c <= limit], default=0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_polars(self):
        """One row per node count: tree and path costs and seconds."""
        import polars as pl

        return pl.DataFrame(
            {
                "nodes": self.nodes,
                "c_tree": self.tree,
                "c_path": self.path,
                "tree_s": self.tree_s,
                "path_s": self.path_s,
                "tree_over_path": [t / p for t, p in zip(self.tree, self.path)],
            }
        ).with_columns(pl.lit(self.model).alias("model"), pl.lit(self.mode).alias("mode"))


def binary_tree(n: int) -> list[int]:
    """Parents of an n-node binary tree (node i under node (i - 1) // 2; node 0 under the root)."""
    return [-1] + [(i - 1) // 2 for i in range(1, n)]


def _time_rows(verifier: Any, model: nn.Module, cache: list[Any], rows: mx.array, restore: CacheRestore, parents):
    mx.synchronize()
    t0 = time.perf_counter()
    if parents is None:
        logits = verifier.forward(model, rows, cache)
    else:
        with tree_attention(model, cache, parents):
            logits = verifier.forward(model, rows, cache)
    verifier.greedy(logits[0])
    seconds = time.perf_counter() - t0
    restore()
    return seconds


def measure_tree_costs(
    model: nn.Module,
    nodes: Sequence[int] = NODE_COUNTS,
    verify: str = "fast",
    offset: int = 256,
    repeats: int = 5,
    warmup: int = 1,
    plain_tokens: int = 8,
    seed: int = 0,
    budget_s: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> TreeCosts:
    """Time verifications of n-node trees and n-token paths (medians of ``repeats`` rounds after
    ``warmup``, node counts round-robin with a plain stretch per round) over a cache of ``offset``
    random tokens; ``budget_s`` stops adding rounds once spent (at least one is kept)."""
    mode = check_verify_mode(verify)
    counts = sorted({int(n) for n in nodes})
    if not counts or counts[0] < 1:
        raise ValueError(f"node counts must be integers >= 1, got {list(nodes)}")
    if repeats < 1 or warmup < 0 or offset < 1:
        raise ValueError("repeats and offset must be >= 1 and warmup >= 0")
    rng = np.random.default_rng(seed)
    vocab = vocab_size(model)
    context = rng.integers(0, vocab, size=offset).tolist()
    probe = mx.array([rng.integers(0, vocab, size=counts[-1] + 1).tolist()], dtype=mx.uint32)
    verifier = verifier_for(model, mode, widths=range(2, counts[-1] + 2), progress=progress)
    started = time.perf_counter()
    tree_s: dict[int, list[float]] = {n: [] for n in counts}
    path_s: dict[int, list[float]] = {n: [] for n in counts}
    plain_s: list[float] = []
    with wired_limit(model, [generation_stream]), mx.stream(generation_stream):
        cache = prefill(model, context)
        restore = CacheRestore(cache)
        for round_ in range(warmup + repeats):
            keep = round_ >= warmup
            t = _time_plain(model, cache, int(probe[0, 0].item()), plain_tokens, restore)
            timed = {
                n: (
                    _time_rows(verifier, model, cache, probe[:, : n + 1], restore, binary_tree(n)),
                    _time_rows(verifier, model, cache, probe[:, : n + 1], restore, None),
                )
                for n in counts
            }
            if keep:
                plain_s.append(t)
                for n, (tree, path) in timed.items():
                    tree_s[n].append(tree)
                    path_s[n].append(path)
                if progress is not None:
                    progress(f"tree costs round {len(plain_s)}/{repeats}: plain step {1e3 * t:.2f} ms")
            if keep and budget_s is not None and time.perf_counter() - started > budget_s:
                break
    plain = statistics.median(plain_s)
    tree = [statistics.median(tree_s[n]) for n in counts]
    path = [statistics.median(path_s[n]) for n in counts]
    return TreeCosts(
        model=model_key(model),
        device=device_name(),
        versions=versions(),
        mode=mode,
        plain_step_s=plain,
        nodes=counts,
        tree=[s / plain for s in tree],
        path=[s / plain for s in path],
        tree_s=tree,
        path_s=path,
        offset=offset,
        repeats=len(plain_s),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )


def tree_costs_path(model: str, device: str, mode: str, root: Path | None = None) -> Path:
    """Where the tree costs of ``model`` (a ``model_key``) on ``device`` in ``mode`` are stored."""
    vers = versions()
    name = f"{_slug(model)}--{_slug(device)}--mlx{vers.get('mlx')}--mlxlm{vers.get('mlx_lm')}--{mode}.json"
    return (root or home()) / "profiles" / "trees" / name


def save_tree_costs(costs: TreeCosts, root: Path | None = None) -> Path:
    path = tree_costs_path(costs.model, costs.device, costs.mode, root)
    write_json_atomic(path, costs.to_dict())
    return path


def load_tree_costs(path: str | Path) -> TreeCosts:
    """Tree costs from ``save_tree_costs``' JSON, or one clear error."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        names = set(TreeCosts.__dataclass_fields__)
        return TreeCosts(**{k: v for k, v in data.items() if k in names})
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"{path}: not readable tree costs ({err}); delete it to measure again") from err


def tree_costs_for(model: nn.Module, verify: str = "fast", **measure: Any) -> TreeCosts:
    """The stored tree costs of ``model`` on this device in ``verify`` mode, measured and stored when absent."""
    path = tree_costs_path(model_key(model), device_name(), check_verify_mode(verify))
    if path.exists():
        return load_tree_costs(path)
    costs = measure_tree_costs(model, verify=verify, **measure)
    save_tree_costs(costs)
    return costs


def tree_break_even(costs: TreeCosts, drafter: Drafter | None = None, d: float | None = None) -> Callable[[int], float]:
    """n -> tokens a verification of an n-node tree must yield to match plain decoding: c_tree(n) + n d."""
    d = drafter_cost(drafter) if d is None else d
    return lambda n: costs.c(n, "tree") + n * d


def best_node_budget(
    costs: TreeCosts | Callable[[int], float], tokens_per_verify: Mapping[int, float], d: float = 0.0
) -> tuple[int, float]:
    """(n, predicted speedup) of the node budget whose measured tokens per verification (including the
    token every verification emits) best beat its cost; (0, 1.0) when none beats plain decoding."""
    break_even = tree_break_even(costs, d=d) if isinstance(costs, TreeCosts) else costs
    best = (0, 1.0)
    for n, tokens in sorted(tokens_per_verify.items()):
        speedup = float(tokens) / break_even(int(n))
        if speedup > best[1]:
            best = (int(n), speedup)
    return best
