"""Verify cost by node count: a token tree of n nodes against a path of n tokens, in plain steps.

``measure_tree_costs`` times both through the verify mode's verifier, n + 1 rows under the tree mask
(``specbench.core.tree``) or the causal one, on a binary tree (every depth branches). ``tree_break_even`` turns the
costs into Auto's break-even of a node budget (``AutoPolicy.choose_node_budget`` picks one). Stored beside the
cost profiles per model, device, versions, BLAS library and verify mode, checked on read; a damaged file is moved
aside with a warning.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import generation_stream, wired_limit

from specbench.common.files import locked, read_or_set_aside, set_aside, write_json_atomic
from specbench.common.identity import device_name, kernel_key, model_key, utc_now, versions
from specbench.core.draft import Drafter
from specbench.core.forward import prefill, vocab_size
from specbench.core.verify import VERIFY_MODES, check_verify_mode
from specbench.cost.breakeven import drafter_cost
from specbench.cost.profile import _number, check_curves, profile_path
from specbench.cost.timing import CacheRestore, kept_rounds, time_plain, time_verify
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
    #: What the kernels depended on when measured (``kernel_key``); "" for files stored before it was kept.
    kernels: str = field(default_factory=kernel_key)

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
    verifier = verifier_for(
        model, mode, widths=range(2, counts[-1] + 2), progress=progress, context=offset + counts[-1] + 1
    )
    started = time.perf_counter()
    with wired_limit(model, [generation_stream]), mx.stream(generation_stream):
        cache = prefill(model, context)
        restore = CacheRestore(cache)

        def one_round() -> tuple[float, list[tuple[float, float]]]:
            plain_step = time_plain(model, cache, int(probe[0, 0].item()), plain_tokens, restore)
            return plain_step, [
                (
                    time_verify(verifier, model, cache, probe[:, : n + 1], restore, parents=binary_tree(n)),
                    time_verify(verifier, model, cache, probe[:, : n + 1], restore),
                )
                for n in counts
            ]

        def enough(kept: list[tuple[float, list[tuple[float, float]]]]) -> bool:
            if progress is not None:
                progress(f"tree costs round {len(kept)}/{repeats}: plain step {1e3 * kept[-1][0]:.2f} ms")
            return budget_s is not None and time.perf_counter() - started > budget_s

        kept = kept_rounds(warmup, repeats, one_round, enough)
    plain_s = [p for p, _ in kept]
    per_count = [list(zip(*at_n)) for at_n in zip(*(rows for _, rows in kept))]  # per n: (tree seconds, path seconds)
    plain = statistics.median(plain_s)
    tree = [statistics.median(t) for t, _ in per_count]
    path = [statistics.median(p) for _, p in per_count]
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
        created=utc_now(),
    )


def tree_costs_path(model: str, device: str, mode: str, root: Path | None = None, kernels: str | None = None) -> Path:
    """Where the tree costs of ``model`` (a ``model_key``) on ``device`` in ``mode`` are stored; ``kernels``
    (default: this process's ``kernel_key()``) keys them by the BLAS library, as profiles are."""
    profile = profile_path(model, device, versions(), root, kernels)
    return profile.parent / "trees" / f"{profile.stem}--{mode}.json"


def save_tree_costs(costs: TreeCosts, root: Path | None = None) -> Path:
    """Write tree costs atomically, keeping the node counts a stored file of the same key has and these
    lack (a damaged one is moved aside): read, merged and written under the file's lock."""
    path = tree_costs_path(costs.model, costs.device, costs.mode, root, costs.kernels)
    with locked(path):
        stored = _read_or_set_aside(path)
        data = costs.to_dict()
        if stored is not None:
            rows = {n: row for n, *row in zip(stored.nodes, stored.tree, stored.path, stored.tree_s, stored.path_s)}
            rows.update({n: row for n, *row in zip(costs.nodes, costs.tree, costs.path, costs.tree_s, costs.path_s)})
            nodes = sorted(rows)
            data.update(nodes=nodes, **{k: [rows[n][i] for n in nodes] for i, k in enumerate(_CURVES)})
        write_json_atomic(path, data)
    return path


_CURVES = ("tree", "path", "tree_s", "path_s")


def check_tree_costs(data: Any) -> TreeCosts:
    """The tree costs in ``data`` (a stored file's JSON), or a ValueError saying what is wrong: the one
    check of every reader. Node counts are increasing integers >= 1, with as many costs and seconds of
    trees and paths, all finite and above zero; the plain step is a time above zero."""
    if not isinstance(data, dict):
        raise ValueError(f"a JSON object was expected, not {type(data).__name__}")
    names = set(TreeCosts.__dataclass_fields__)
    try:
        costs = TreeCosts(**{"kernels": "", **{k: v for k, v in data.items() if k in names}})
    except TypeError as err:
        raise ValueError(str(err)) from None
    if not all(isinstance(getattr(costs, name), str) for name in ("model", "device", "kernels")):
        raise ValueError("'model', 'device' and 'kernels' must be text")
    if costs.mode not in VERIFY_MODES:
        raise ValueError(f"mode {costs.mode!r} is not a verify mode ({', '.join(VERIFY_MODES)})")
    if not isinstance(costs.versions, dict):
        raise ValueError("'versions' is not a JSON object")
    check_curves(costs.nodes, {repr(name): getattr(costs, name) for name in _CURVES}, "the node counts")
    if not (_number(costs.plain_step_s) and costs.plain_step_s > 0):
        raise ValueError(f"plain_step_s is {costs.plain_step_s!r}, not a time above zero")
    return costs


def load_tree_costs(path: str | Path) -> TreeCosts:
    """Tree costs from ``save_tree_costs``' JSON, or one ValueError naming the file and what is wrong."""
    path = Path(path)
    try:
        return check_tree_costs(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as err:
        raise ValueError(f"the stored tree costs {path} are damaged or unreadable ({err})") from err


def _read_or_set_aside(path: Path, key: dict[str, Any] | None = None) -> TreeCosts | None:
    """The tree costs at ``path``; None when there are none, or when they are damaged or, with ``key`` (field ->
    value), hold another model's, device's, mode's or BLAS's costs than they are stored for (then the file is
    moved aside with a warning naming it, to be measured again)."""
    costs = read_or_set_aside(path, load_tree_costs, "tree costs")
    if costs is None:
        return None
    found = {**asdict(costs), **{f"versions.{k}": v for k, v in costs.versions.items()}}
    wrong = sorted(name for name, value in (key or {}).items() if found.get(name) != value)
    if wrong:
        set_aside(path, "tree costs", f"its {', '.join(wrong)} are not those it is stored for")
        return None
    return costs


def stored_tree_costs(model: nn.Module, verify: str = "fast") -> TreeCosts | None:
    """The stored tree costs of ``model`` on this device, these versions and this BLAS library in ``verify``
    mode; None when there are none, or when they are damaged or not this key's (the file is then moved aside
    with a warning naming it)."""
    vers, shape, device, mode = versions(), model_key(model), device_name(), check_verify_mode(verify)
    key = {"model": shape, "device": device, "mode": mode, "kernels": kernel_key()}
    key |= {"versions.mlx": vers.get("mlx"), "versions.mlx_lm": vers.get("mlx_lm")}
    return _read_or_set_aside(tree_costs_path(shape, device, mode), key)


def tree_costs_for(model: nn.Module, verify: str = "fast", **measure: Any) -> TreeCosts:
    """The stored tree costs of ``model`` on this device in ``verify`` mode, measured and stored when absent
    (or damaged: the file is moved aside with a warning)."""
    stored = stored_tree_costs(model, verify)
    if stored is not None:
        return stored
    costs = measure_tree_costs(model, verify=verify, **measure)
    save_tree_costs(costs)
    return costs


def tree_break_even(costs: TreeCosts, drafter: Drafter | None = None, d: float | None = None) -> Callable[[int], float]:
    """n -> tokens a verification of an n-node tree must yield to match plain decoding: c_tree(n) + n d."""
    d = drafter_cost(drafter) if d is None else d
    return lambda n: costs.c(n, "tree") + n * d
