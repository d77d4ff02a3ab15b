"""SuffixIndex: occurrence counts of the substrings of a set of token sequences, for SuffixDecoding.

The reference implementation (ArcticInference) keeps a depth-bounded suffix tree of C++ node objects and walks
up to ``max_depth`` active nodes per appended token. In Python that walk alone would cost ~30 us per token, so
the index here is a suffix automaton (Blumer et al.; generalised to many sequences) held in flat ``array``
columns, with transitions in one dict keyed by ``state << 20 | token``. A state groups the substrings that
share their end positions, so it has one occurrence count for all of them and one suffix link to the next
shorter group. Appending a token costs amortised O(1) automaton work plus at most ``max_depth`` count
updates; eviction replays the evicted sequence and decrements the same counts.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterator, Sequence

_SHIFT = 20
_MAX_TOKEN = 1 << _SHIFT
_NONE = -1  # no child yet
_STALE = -2  # most frequent child must be recomputed (after an eviction)
_SEP = -1  # separator between sequences in the token store (never a token)


class SuffixIndex:
    """Occurrence counts of all substrings (length <= ``max_depth``) of a set of token sequences: sequences are
    added with ``start_sequence`` and ``extend``, removed with ``remove``; ``speculate`` drafts a continuation of
    a matched suffix."""

    def __init__(self, max_depth: int = 64, compact: bool = True):
        if max_depth < 2:
            raise ValueError(f"max_depth must be >= 2, got {max_depth}")
        self.max_depth = max_depth
        # Per-state columns. State 0 is the root (empty string).
        self.length = array("i", [0])  # longest substring in the state
        self.link = array("i", [-1])  # suffix link
        self.count = array("i", [0])  # occurrences (for states with substrings of length <= max_depth)
        self.lastpos = array("i", [-1])  # store index of the latest occurrence's last token
        self.best = array("i", [_NONE])  # most frequent child state (ties: most recent)
        self.token = array("i", [-1])  # the token on every transition into the state
        self.first_edge = array("i", [-1])  # head of the state's list of outgoing tokens
        self.edge_token = array("i")
        self.edge_next = array("i")
        self.next: dict[int, int] = {}  # (state << 20 | token) -> state
        # Tokens of all sequences, separated by _SEP; positions index it.
        self.store: array | list = array("i") if compact else []
        self.last = 0  # state of the current sequence (for append)
        self.anchor = 0  # state of the current sequence's suffix of length anchor_len
        self.anchor_len = 0
        self.stale = False  # some best pointers are stale (after an eviction)

    # -- building ------------------------------------------------------------------------------
    def start_sequence(self, tokens: Sequence[int] = ()) -> tuple[int, int]:
        """Begin a new sequence with ``tokens``; returns their store positions [start, end)."""
        if len(self.store):
            self.store.append(_SEP)
        self.last = self.anchor = self.anchor_len = 0
        start = len(self.store)
        self.extend(tokens)
        return start, len(self.store)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the current sequence."""
        append = self.append
        for t in tokens:
            append(t)

    def _new_state(self, length: int, token: int) -> int:
        self.length.append(length)
        self.link.append(0)
        self.count.append(0)
        self.lastpos.append(-1)
        self.best.append(_NONE)
        self.token.append(token)
        self.first_edge.append(-1)
        return len(self.length) - 1

    def _add_edge(self, state: int, token: int, target: int) -> None:
        self.next[state << _SHIFT | token] = target
        self.edge_token.append(token)
        self.edge_next.append(self.first_edge[state])
        self.first_edge[state] = len(self.edge_token) - 1

    def _clone(self, q: int, length: int) -> int:
        clone = self._new_state(length, self.token[q])
        self.link[clone] = self.link[q]
        self.count[clone] = self.count[q]
        self.lastpos[clone] = self.lastpos[q]
        self.best[clone] = self.best[q]
        for t, v in self.children(q):
            self._add_edge(clone, t, v)
        return clone

    def children(self, u: int) -> Iterator[tuple[int, int]]:
        """(token, state) of every transition out of state ``u``, the latest added first."""
        e = self.first_edge[u]
        while e >= 0:
            t = self.edge_token[e]
            yield t, self.next[u << _SHIFT | t]
            e = self.edge_next[e]

    def _redirect(self, p: int, c: int, q: int, clone: int) -> None:
        nxt, link, best = self.next, self.link, self.best
        while p != -1:
            key = p << _SHIFT | c
            if nxt.get(key) != q:
                break
            nxt[key] = clone
            if best[p] == q:
                best[p] = clone
            p = link[p]

    def append(self, c: int) -> None:
        """Append one token to the current sequence."""
        if not 0 <= c < _MAX_TOKEN:
            raise ValueError(f"token id {c} is outside [0, {_MAX_TOKEN})")
        nxt, length, link = self.next, self.length, self.link
        pos = len(self.store)
        self.store.append(c)
        # 1. Automaton extension (generalised: the transition may exist at a sequence start).
        last = self.last
        q = nxt.get(last << _SHIFT | c)
        if q is not None:
            if length[q] == length[last] + 1:
                self.last = q
            else:
                clone = self._clone(q, length[last] + 1)
                self._redirect(last, c, q, clone)
                link[q] = clone
                self.last = clone
        else:
            cur = self._new_state(length[last] + 1, c)
            p = last
            while p != -1 and (p << _SHIFT | c) not in nxt:
                self._add_edge(p, c, cur)
                p = link[p]
            if p != -1:
                q = nxt[p << _SHIFT | c]
                if length[p] + 1 == length[q]:
                    link[cur] = q
                else:
                    clone = self._clone(q, length[p] + 1)
                    self._redirect(p, c, q, clone)
                    link[q] = clone
                    link[cur] = clone
            self.last = cur
        # 2. Counts: every substring of length <= max_depth ending here gains an occurrence.
        self.anchor, self.anchor_len = self._count(self.anchor, self.anchor_len, c, pos)

    def remove(self, start: int, end: int) -> None:
        """Remove the occurrences of the sequence stored at positions [start, end)."""
        a, alen = 0, 0
        for i in range(start, end):
            a, alen = self._count(a, alen, self.store[i], None)
        self.stale = True

    def _count(self, a: int, alen: int, c: int, pos: int | None) -> tuple[int, int]:
        """Add one occurrence at store position ``pos`` (None: remove one) to every substring of length <=
        max_depth ending with ``c`` after the suffix (state ``a``, length ``alen``); the new suffix's state and
        length. Walks the states of the suffixes of length < max_depth (parents) and moves to their children by
        c, updating counts once per child state and the parents' most-frequent-child pointers."""
        nxt, length, link, count, best, lastpos = self.next, self.length, self.link, self.count, self.best, self.lastpos
        if alen >= self.max_depth:
            alen = self.max_depth - 1
        while a and length[link[a]] >= alen:
            a = link[a]
        p = a
        prev = -1
        while p != -1:
            v = nxt[p << _SHIFT | c]
            b = best[p]
            if pos is None:
                if v != prev:
                    count[v] -= 1
                    prev = v
                if b == v:
                    best[p] = _STALE
            else:
                if v != prev:
                    count[v] += 1
                    lastpos[v] = pos
                    prev = v
                if b != v and (b == _NONE or (b >= 0 and count[v] >= count[b])):
                    best[p] = v
            p = link[p]
        return nxt[a << _SHIFT | c], alen + 1

    def _refresh_best(self, u: int) -> int:
        """Recompute the most frequent live child of ``u`` (ties: the most recent)."""
        count, lastpos = self.count, self.lastpos
        best, best_key = _NONE, (0, -1)
        for _, v in self.children(u):
            key = (count[v], lastpos[v])
            if count[v] > 0 and key > best_key:
                best, best_key = v, key
        self.best[u] = best
        return best

    # -- matching ------------------------------------------------------------------------------
    def match(self, tokens: Sequence[int], state: int = 0, matched: int = 0) -> tuple[int, int]:
        """Follow ``tokens`` from (state, matched): returns the state and length of the longest
        live suffix (length <= max_depth) of everything followed so far."""
        nxt, length, link, count = self.next, self.length, self.link, self.count
        depth = self.max_depth
        for c in tokens:
            if matched >= depth:
                matched = depth - 1
                while state and length[link[state]] >= matched:
                    state = link[state]
            while True:
                v = nxt.get(state << _SHIFT | c)
                if v is not None and count[v] > 0:
                    state, matched = v, matched + 1
                    break
                if state == 0:
                    matched = 0
                    break
                state = link[state]
                matched = length[state]
        return state, matched

    # -- drafting ------------------------------------------------------------------------------
    def speculate(
        self, state: int, matched: int, limits: DraftLimits, min_token_prob: float, beat: float, tree: bool = False
    ) -> tuple[float, list[int], int, list[int] | None]:
        """Best draft continuing the suffixes of length <= ``matched`` held by ``state`` and its
        suffix chain: a path, or with ``tree`` a speculation tree (``_tree``). Returns (score, tokens,
        match length, parents: None for a path); only a score above ``beat`` counts."""
        length, link = self.length, self.link
        limit, mstar, reach = limits.limit, limits.mstar, limits.reach
        hi = min(matched, limits.max_match)
        best_score, best_tokens, best_m, best_parents = beat, [], 0, None
        u = state
        while u > 0:
            lo = length[link[u]] + 1
            if hi >= lo:
                if reach[hi] <= best_score:
                    break
                if tree:
                    # A tree depends on its budget and on how deep the match leaves it room to grow.
                    grown: dict[tuple[int, int], tuple[float, list[int], list[int]]] = {}
                    for m in range(hi, lo - 1, -1):
                        if limit[m] <= best_score:
                            continue
                        key = (limit[m], min(limit[m], self.max_depth - m))
                        if key not in grown:
                            grown[key] = self._tree(u, key[0], min_token_prob, key[1])
                        score, tokens, parents = grown[key]
                        if score > best_score:
                            best_score, best_tokens, best_m, best_parents = score, tokens, m, parents
                else:
                    m = mstar if lo <= mstar <= hi else (hi if hi < mstar else lo)
                    if limit[m] > best_score:
                        score, tokens = self._path(u, limit[m], min_token_prob)
                        if score > best_score:
                            best_score, best_tokens, best_m = score, tokens, m
            u = link[u]
            hi = min(length[u], hi)
        return best_score, best_tokens, best_m, best_parents

    def _tree(
        self, u: int, budget: int, min_token_prob: float, max_node_depth: int
    ) -> tuple[float, list[int], list[int]]:
        """The reference's speculation tree from ``u``: up to ``budget`` nodes, most probable first
        (a node's probability: its parent's times child count / parent count; children below
        ``min_token_prob`` are left out; among equal probabilities the most recent continuation first,
        as the path's most frequent child is chosen), none
        deeper than ``max_node_depth`` (the match plus a path stays within ``max_depth``).
        Returns (score: the sum of the nodes' probabilities, tokens, parents)."""
        count, token, store = self.count, self.token, self.store
        tokens: list[int] = []
        parents: list[int] = []
        node_depth: list[int] = []
        score = 0.0
        order = 0
        # (-probability, -recency, order, kind, state or store position, parent node); kinds: 0 add the
        # token into a state, 1 expand a state's children, 2 add the store's token at a position.
        first = -(1 << 62)
        heap: list[tuple[float, int, int, int, int, int]] = [(-1.0, first, 0, 1, u, -1)]
        while heap and len(tokens) < budget:
            neg, _, _, kind, at, parent = heapq.heappop(heap)
            order += 1
            if kind == 0 or kind == 2:
                t = token[at] if kind == 0 else (store[at] if at < len(store) else _SEP)
                depth = node_depth[parent] + 1 if parent >= 0 else 1
                if t == _SEP or depth > max_node_depth:
                    continue
                tokens.append(t)
                parents.append(parent)
                node_depth.append(depth)
                score -= neg
                follow = (1, at) if kind == 0 else (2, at + 1)
                heapq.heappush(heap, (neg, first, order, follow[0], follow[1], len(tokens) - 1))
                continue
            cu = count[at]
            if cu == 1:
                # A single occurrence: its continuation in the store, at the same probability.
                heapq.heappush(heap, (neg, first, order, 2, self.lastpos[at] + 1, parent))
                continue
            for _, v in self.children(at):
                prob = -neg * count[v] / cu
                if count[v] > 0 and prob >= min_token_prob:
                    order += 1
                    heapq.heappush(heap, (-prob, -self.lastpos[v], order, 0, v, parent))
        return score, tokens, parents

    def _path(self, u: int, budget: int, min_token_prob: float) -> tuple[float, list[int]]:
        """Follow the most frequent children from ``u`` for up to ``budget`` tokens."""
        count, best, token = self.count, self.best, self.token
        tokens: list[int] = []
        prob, score = 1.0, 0.0
        while len(tokens) < budget:
            cu = count[u]
            if cu == 1:
                # A single occurrence: its continuation in the store, at the same probability.
                start = self.lastpos[u] + 1
                tail = self.store[start : start + budget - len(tokens)]
                if _SEP in tail:
                    tail = tail[: tail.index(_SEP)]
                tokens.extend(tail)
                for _ in tail:  # summed one by one, as a walk would
                    score += prob
                break
            v = best[u]
            if v < 0:
                if v == _NONE:
                    break
                v = self._refresh_best(u)
                if v < 0:
                    break
            prob *= count[v] / cu
            if prob < min_token_prob:
                break
            tokens.append(token[v])
            score += prob
            u = v
        return score, tokens


class DraftLimits:
    """Per-match-length draft budgets for one (max_spec_tokens, factor, offset, depth).

    A path's budget ends at depth ``depth``; a tree's (``tree``) counts nodes, and the tree bounds
    each node's depth itself."""

    def __init__(self, max_spec_tokens: int, factor: float, offset: float, depth: int, tree: bool = False):
        self.max_match = depth - 1
        # limit[m]: tokens a match of length m may draft.
        self.limit = [0] + [
            max(0, min(max_spec_tokens, int(m * factor + offset + 1e-6), max_spec_tokens if tree else depth - m))
            for m in range(1, depth)
        ]
        # mstar: the longest match with the largest limit; limit rises up to it and falls after.
        self.mstar = max(range(1, depth), key=lambda m: (self.limit[m], m))
        # reach[h]: the largest limit of any match length <= h.
        self.reach = [0] * depth
        for m in range(1, depth):
            self.reach[m] = max(self.reach[m - 1], self.limit[m])
