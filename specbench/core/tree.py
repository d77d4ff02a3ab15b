"""Token trees: drafts that branch, verified in one forward pass.

A tree draft is a list of node tokens with a parent index per node (``-1``: a child of the last
emitted token, the root; parents come before their children). A path is the tree whose node i has
parent i - 1. The verification forward runs the root and every node as one batch of rows (row 0
the root, row i + 1 node i): ``tree_attention`` makes each row attend to the whole cache and to
its ancestors only, at the position of its depth, so each row computes what serial decoding
along that node's own path computes. Afterwards the KV cache keeps the accepted path's rows
(``CacheRollback.compact``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from specbench.core.forward import text_model
from specbench.core.swap import restore_class, swap_class


def check_parents(parents: Sequence[int], nodes: int, drafter: str = "drafter") -> list[int]:
    """``parents`` as ints, or one clear error: one parent per node, each -1 (the root) or an
    earlier node."""
    if len(parents) != nodes:
        raise ValueError(
            f"drafter {drafter} gave {len(parents)} parents for {nodes} drafted tokens: a tree draft needs one "
            "parent index per node"
        )
    out = []
    for i, p in enumerate(parents):
        if isinstance(p, bool) or not isinstance(p, int) and not hasattr(p, "__index__"):
            raise TypeError(f"drafter {drafter} gave parent {p!r} for node {i}: parent indices must be integers")
        p = int(p)
        if not -1 <= p < i:
            raise ValueError(
                f"drafter {drafter} gave parent {p} for node {i}: a parent is -1 (the last emitted token) or an "
                "earlier node (parents come before their children)"
            )
        out.append(p)
    return out


def is_path(parents: Sequence[int]) -> bool:
    """Whether the tree is one path (node i's parent is i - 1)."""
    return all(p == i - 1 for i, p in enumerate(parents))


def children(parents: Sequence[int]) -> dict[int, list[int]]:
    """Children of each node in node order (key -1: the root's)."""
    out: dict[int, list[int]] = {-1: []}
    for i, p in enumerate(parents):
        out.setdefault(p, []).append(i)
        out.setdefault(i, [])
    return out


def depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node (a child of the root has depth 1)."""
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def check_siblings(tokens: Sequence[int], parents: Sequence[int], drafter: str = "drafter") -> None:
    """Siblings must carry distinct tokens (a repeated sibling could never be accepted)."""
    seen: set[tuple[int, int]] = set()
    for t, p in zip(tokens, parents):
        if (p, t) in seen:
            raise ValueError(f"drafter {drafter} drafted token {t} twice under the same parent: siblings must differ")
        seen.add((p, t))


def tree_mask(parents: Sequence[int]) -> mx.array:
    """Boolean [n + 1, n + 1]: row r may attend to column c (c is r or an ancestor of r; row 0 is the root)."""
    n = len(parents)
    rows = [[False] * (n + 1) for _ in range(n + 1)]
    rows[0][0] = True
    for i, p in enumerate(parents):
        r = i + 1
        rows[r] = list(rows[p + 1])
        rows[r][r] = True
    return mx.array(rows)


def breadth_first_tree(paths: Sequence[Sequence[int]], budget: int) -> tuple[list[int], list[int]]:
    """Merge candidate continuations into one tree grown level by level (depth 1 of every candidate,
    then depth 2, ...; earlier candidates first within a level) up to ``budget`` nodes."""
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}
    reach = [-1] * len(paths)  # each candidate's deepest node so far (-1: the root)
    for depth in range(max((len(p) for p in paths), default=0)):
        for c, path in enumerate(paths):
            if depth >= len(path) or (depth > 0 and reach[c] < 0):
                continue
            parent = reach[c]
            node = index.get((parent, int(path[depth])))
            if node is None:
                if len(tokens) >= budget:
                    return tokens, parents
                node = len(tokens)
                tokens.append(int(path[depth]))
                parents.append(parent)
                index[(parent, int(path[depth]))] = node
            reach[c] = node
    return tokens, parents


# -- the tree forward ----------------------------------------------------------------------------


def attention_modules(model: nn.Module, cache: list[Any]) -> list[nn.Module]:
    """The attention module of each layer, or one clear error for models trees cannot verify."""
    layers = list(text_model(model).model.layers)
    unsupported = sorted({type(c).__name__ for c in cache if not isinstance(c, (KVCache, QuantizedKVCache))})
    if unsupported:
        raise ValueError(
            f"token-tree verification needs plain key-value caches in every layer, but this model uses "
            f"{', '.join(unsupported)} (recurrent or sliding-window layers cannot branch); draft paths "
            "(the drafter's tree=False) for this model"
        )
    modules = [getattr(layer, "self_attn", None) for layer in layers]
    if any(m is None or not hasattr(m, "rope") for m in modules):
        raise ValueError(
            f"token-tree verification supports attention layers with RoPE (llama, qwen3, qwen3_moe); "
            f"{type(layers[0]).__module__} is not one: draft paths (tree=False) for this model"
        )
    return modules


class _RowRoPE:
    """A model's RoPE applied at each row's own position: ``positions`` (absolute), or the cache offset plus
    them where ``relative`` (a tree row's depth)."""

    def __init__(self, rope: Any, positions: mx.array, relative: bool = False):
        self.rope = rope
        self.positions = positions
        self.relative = relative

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        if x.ndim != 4 or x.shape[0] != 1 or x.shape[2] != self.positions.size:
            return self.rope(x, offset=offset)
        # One row per batch entry, each with its own offset.
        positions = self.positions + offset if self.relative else self.positions
        return self.rope(x.transpose(2, 1, 0, 3), offset=positions).transpose(2, 1, 0, 3)


class _TreeState:
    def __init__(self, parents: Sequence[int], cache: list[Any]):
        self.caches = {id(c) for c in cache}
        self.in_call = False
        self.width = len(parents) + 1
        self.local = tree_mask(parents)
        self.masks: dict[int, mx.array] = {}
        self.visible = [[0]]
        for i, p in enumerate(parents):
            self.visible.append(self.visible[p + 1] + [i + 1])

    def mask(self, offset: int) -> mx.array:
        mask = self.masks.get(offset)
        if mask is None:
            past = mx.ones((self.width, offset), dtype=mx.bool_)
            mask = mx.concatenate([past, self.local], axis=1) if offset else self.local
            self.masks[offset] = mask
        return mask


class _TreeAttention:
    """Mixed in front of an attention class during a tree forward: the tree mask replaces the causal one."""

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        state = self.__dict__.get("_specbench_tree")
        if state is None or id(cache) not in state.caches:  # another forward (an exact-mode calibration)
            return super().__call__(x, mask, cache)
        if x.shape[1] != state.width:
            raise ValueError(
                f"a token tree of {state.width} rows was run as a forward of {x.shape[1]} rows (for instance exact "
                "mode's 'serial' level): trees are verified in one forward; use another exact level or paths"
            )
        state.in_call = True
        try:
            return super().__call__(x, state.mask(cache.offset), cache)
        finally:
            state.in_call = False


@contextlib.contextmanager
def tree_attention(model: nn.Module, cache: list[Any], parents: Sequence[int]) -> Iterator[None]:
    """Inside, a forward of the root and the tree's nodes (width ``len(parents) + 1``) gives each row
    the cache and its ancestors to attend to, at the position of its depth."""
    modules = attention_modules(model, cache)
    state = _TreeState(parents, cache)
    open_trees.append(state)
    depth = mx.array([0] + depths(parents), dtype=mx.int32)
    try:
        with _swapped(modules, state, lambda rope: _RowRoPE(rope, depth, relative=True)):
            yield
    finally:
        open_trees.remove(state)


class _RowsState:
    """Rows with their own attention mask over the cache and positions (``row_attention``)."""

    def __init__(self, mask: mx.array, cache: list[Any]):
        self.caches = {id(c) for c in cache}
        self.in_call = False
        self.width = mask.shape[0]
        self.full = mask

    def mask(self, offset: int) -> mx.array:
        if self.full.shape[1] != offset + self.width:
            raise ValueError(
                f"a row mask over {self.full.shape[1]} columns was given for a cache of {offset} entries and "
                f"{self.width} new rows: it needs {offset + self.width}"
            )
        return self.full


@contextlib.contextmanager
def row_attention(modules: Sequence[nn.Module], cache: list[Any], mask: mx.array, positions: Sequence[int]):
    """Inside, a forward of ``mask.shape[0]`` rows through attention ``modules`` (with RoPE) whose caches
    are ``cache`` gives row r the columns where ``mask[r]`` (boolean [rows, cached + rows]) is true, at
    absolute position ``positions[r]``: a token tree drafted level by level through a draft head."""
    if len(positions) != mask.shape[0]:
        raise ValueError(f"{mask.shape[0]} mask rows but {len(positions)} positions")
    if any(not hasattr(m, "rope") for m in modules):
        raise ValueError("row attention needs attention modules with RoPE (llama, qwen3, qwen3_moe)")
    state = _RowsState(mask, cache)
    where = mx.array([int(p) for p in positions], dtype=mx.int32)
    with _swapped(modules, state, lambda rope: _RowRoPE(rope, where)):
        yield


@contextlib.contextmanager
def _swapped(modules: Sequence[nn.Module], state: Any, make_rope: Any) -> Iterator[None]:
    """The attention modules' class and RoPE swapped for the tree's while inside."""
    swapped: list[tuple[nn.Module, Any]] = []
    try:
        for module in modules:
            own_rope = module.__dict__.get("rope", _NO_ROPE)
            swap_class(module, _TreeAttention, _specbench_tree=state, rope=make_rope(module.rope))
            swapped.append((module, own_rope))
        yield
    finally:
        for module, own_rope in swapped:
            restore_class(module, "_specbench_tree")
            if own_rope is _NO_ROPE:
                module.__dict__.pop("rope", None)
            else:
                module.__dict__["rope"] = own_rope


_NO_ROPE = object()

#: Tree forwards in progress (innermost last): exact mode's attention asks ``visible_rows`` only while one is.
open_trees: list[_TreeState] = []


def tree_forward(width: int) -> bool:
    """Whether a tree forward of ``width`` rows is open (its model call runs in one piece)."""
    return bool(open_trees) and open_trees[-1].width == width


def visible_rows(width: int) -> list[list[int]] | None:
    """While a tree forward of ``width`` rows runs: for each row, the rows it attends (its ancestors
    and itself, in order; row 0 the root). None when no tree forward of that width runs."""
    if open_trees and open_trees[-1].in_call and open_trees[-1].width == width:
        return open_trees[-1].visible
    return None
