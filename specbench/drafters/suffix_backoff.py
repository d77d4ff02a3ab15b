"""SuffixDecoding's back-off speculation tree: the paper's draft as a spine, the store's alternatives as branches.

The reference tree (``SuffixIndex.speculate(tree=True)``) grows from one match length only, and takes
a continuation seen once as certain (probability 1 at every depth). The longest matches in a request
are mostly seen once, so its trees are paths there and branch only on short, frequent matches. The
rule here (fixed before measuring on the embedded model's outputs):

1. **Spine.** The paper's path draft (best match over match lengths, most frequent continuation,
   ``min_token_prob``, the per-match budget ``max_spec_factor`` x match length) is kept whole, so a
   tree never holds less than the path does.
2. **Node estimate.** Every node (the root, spine nodes, branches) has the automaton state of the
   longest stored suffix of context + the node's path (``SuffixIndex.match``). Its next-token
   distribution is Witten-Bell interpolation over the distinct states on that state's suffix chain
   (longest match first, down to length 1; no parameters): at a state with continuation counts
   c(t), total c and N distinct continuations, P(t) = (c(t) + N x P_shorter(t)) / (c + N); the
   shortest state backs off to nothing. So a continuation seen once keeps at least 1/2 of the mass
   and shorter matches that continue differently get the rest.
3. **Branches.** Every node's children (the root's and the spine's included; the spine's own next
   node excepted), scored by cumulative probability (the product of the estimates along the path
   from the root), best first; a branch grows its own children, the spine's tip may grow deeper. A
   candidate below ``min_token_prob`` is dropped. The tree stops at ``budget`` nodes in all (the
   spine included: the drafter's ``max_spec_tokens``, capped by the policy's k) or at depth
   ``max_depth - 1`` past the match.
4. **Source.** Branches come from the index (local or global) whose match gave the spine; with no
   spine there is no draft (as for paths).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from specbench.drafters.suffix_index import SuffixIndex


def backoff_distribution(index: SuffixIndex, state: int) -> dict[int, float]:
    """Witten-Bell next-token estimate at ``state``: interpolated over its suffix chain (root excluded)."""
    count = index.count
    levels: list[tuple[dict[int, int], int]] = []
    u = state
    while u > 0:
        counts = {t: count[v] for t, v in index.children(u) if count[v] > 0}
        if counts:
            levels.append((counts, sum(counts.values())))
        u = index.link[u]
    probs: dict[int, float] = {}
    for counts, total in reversed(levels):  # shortest first
        distinct = len(counts)
        scale = distinct / (total + distinct)
        mixed = {t: p * scale for t, p in probs.items()}
        for t, c in counts.items():
            mixed[t] = mixed.get(t, 0.0) + c / (total + distinct)
        probs = mixed
    return probs


def backoff_tree(
    index: SuffixIndex,
    state: int,
    matched: int,
    spine: Sequence[int],
    budget: int,
    min_token_prob: float,
) -> tuple[list[int], list[int]]:
    """The tree of rule 1-3 above from the match (``state``, ``matched``) of ``index``: (tokens, parents).
    The first ``len(spine)`` nodes are the spine in order (node i's parent i - 1)."""
    max_node_depth = index.max_depth - 1
    tokens = [int(t) for t in spine[:budget]]
    parents = list(range(-1, len(tokens) - 1))
    if not tokens or len(tokens) >= budget:
        return tokens, parents
    # Per node: (state, matched, cumulative probability, depth); index 0 is the root.
    nodes: list[tuple[int, int, float, int]] = [(state, matched, 1.0, 0)]
    heap: list[tuple[float, int, int, int]] = []  # (-probability, order, token, parent node + 1)
    order = 0

    def expand(at: int, skip: int | None) -> None:
        nonlocal order
        u, _, prob, depth = nodes[at]
        if depth >= max_node_depth:
            return
        for t, p in backoff_distribution(index, u).items():
            if t != skip and prob * p >= min_token_prob:
                order += 1
                heapq.heappush(heap, (-prob * p, order, t, at))

    for i, t in enumerate(tokens):
        u, m, prob, depth = nodes[i]
        p = backoff_distribution(index, u).get(t, 0.0)
        nodes.append((*index.match([t], u, m), prob * p, depth + 1))
    for i in range(len(tokens) + 1):
        expand(i, tokens[i] if i < len(tokens) else None)
    while heap and len(tokens) < budget:
        neg, _, t, at = heapq.heappop(heap)
        u, m, _, depth = nodes[at]
        tokens.append(t)
        parents.append(at - 1)
        nodes.append((*index.match([t], u, m), -neg, depth + 1))
        expand(len(nodes) - 1, None)
    return tokens, parents
