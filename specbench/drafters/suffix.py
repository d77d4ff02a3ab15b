"""SuffixDecoding: draft from the longest suffix matches in the request and in earlier sequences.

Follows Oliaro et al., "SuffixDecoding" (arXiv 2411.04975) and the reference implementation in
ArcticInference (``arctic_inference/suffix_decoding``): a per-request (local) index over the prompt
and the tokens generated so far, and a global index of earlier sequences, bounded by a number of
sequences and of tokens with FIFO eviction. Every substring of length <= ``max_depth`` counts its
occurrences; a continuation token's probability is the product of child/parent count ratios along
its path; drafting follows the most frequent child and stops below ``min_token_prob``. For every
match length m the budget is min(max_spec_tokens, floor(m * max_spec_factor + max_spec_offset))
(and the path ends at depth ``max_depth``, as the reference's depth-bounded tree does); the draft
with the best score (sum of token probabilities; ties to the longer match) wins, local against
global (global only when strictly better).

Data structure. The reference keeps a depth-bounded suffix tree of C++ node objects and walks up to
``max_depth`` active nodes per appended token. In Python that walk alone would cost ~30 us per
token, so each index here is a suffix automaton (Blumer et al.; generalised to many sequences) held
in flat ``array`` columns, with transitions in one dict keyed by ``state << 20 | token``. A state
groups the substrings that share their end positions, so it has one occurrence count for all of
them and one suffix link to the next shorter group:

* appending a token is amortised O(1) automaton work plus one step per state on the new suffix
  chain (substrings of length <= ``max_depth`` ending at the new token: their counts and the
  parents' most-frequent-child pointers are updated; typically a few states, never more than
  ``max_depth``);
* a draft walks the suffix chain of the current match (one state per distinct occurrence count,
  longest first, pruned once no shorter match can beat the best score) and follows the
  most-frequent-child pointers; once a path is down to a single occurrence the rest is one slice
  of the stored tokens;
* eviction replays the evicted sequence through the automaton and decrements the same counts;
  parents whose most frequent child lost a count are recomputed when next used; the automaton is
  rebuilt from the live sequences once evicted tokens outnumber them (amortised O(1) per token).

Counts equal the reference's node counts (occurrences of each substring of length <= max_depth,
the current request's end included in the local index), so drafts and scores are the reference's.
Two choices differ: among children with equal counts the most recent one wins (the reference takes
an unspecified one), and the response being generated joins the global index only when the request
ends (the reference adds it while generating; here the local index already holds it).
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import Sequence

from specbench.drafters.base import Draft, Drafter

_SHIFT = 20
_MAX_TOKEN = 1 << _SHIFT
_NONE = -1  # no child yet
_STALE = -2  # most frequent child must be recomputed (after an eviction)
_SEP = -1  # separator between sequences in the token store (never a token)


class SuffixIndex:
    """Occurrence counts of all substrings (length <= ``max_depth``) of a set of token sequences.

    A generalised suffix automaton with per-state counts restricted to substrings of length
    <= ``max_depth``. Sequences are added with ``add``/``append`` and removed (oldest first, or any
    order) with ``remove``; ``speculate`` drafts a continuation of a matched suffix.
    """

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

    # -- size ----------------------------------------------------------------------------------
    @property
    def states(self) -> int:
        return len(self.length)

    def nbytes(self) -> int:
        """Approximate memory of the index in bytes (arrays, dict table, dict keys and values)."""
        import sys

        columns = (self.length, self.link, self.count, self.lastpos, self.best, self.token,
                   self.first_edge, self.edge_token, self.edge_next)
        size = sum(c.itemsize * c.buffer_info()[1] for c in columns)
        size += sys.getsizeof(self.next) + 32 * len(self.next)  # table + one int key each
        size += sys.getsizeof(self.store) if isinstance(self.store, list) else len(self.store) * 4
        return size

    # -- building ------------------------------------------------------------------------------
    def start_sequence(self) -> int:
        """Begin a new sequence; returns the store position of its first token."""
        if len(self.store):
            self.store.append(_SEP)
        self.last = 0
        self.anchor = 0
        self.anchor_len = 0
        return len(self.store)

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
        nxt = self.next
        e = self.first_edge[q]
        edge_token, edge_next = self.edge_token, self.edge_next
        while e >= 0:
            t = edge_token[e]
            self._add_edge(clone, t, nxt[q << _SHIFT | t])
            e = edge_next[e]
        return clone

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
        # Walk the states of the previous suffixes of length < max_depth (parents) and move to
        # their children by c (the new suffixes); update counts once per child state and the
        # parents' most-frequent-child pointers.
        a, alen = self.anchor, self.anchor_len
        if alen >= self.max_depth:
            alen = self.max_depth - 1
        while a and length[link[a]] >= alen:
            a = link[a]
        count, lastpos, best = self.count, self.lastpos, self.best
        p = a
        prev = -1
        while p != -1:
            v = nxt[p << _SHIFT | c]
            if v != prev:
                count[v] += 1
                lastpos[v] = pos
                prev = v
            b = best[p]
            if b != v and (b == _NONE or (b >= 0 and count[v] >= count[b])):
                best[p] = v
            p = link[p]
        self.anchor = nxt[a << _SHIFT | c]
        self.anchor_len = alen + 1

    def remove(self, start: int, end: int) -> None:
        """Remove the occurrences of the sequence stored at positions [start, end)."""
        nxt, length, link = self.next, self.length, self.link
        count, best, store = self.count, self.best, self.store
        depth = self.max_depth
        a, alen = 0, 0
        for i in range(start, end):
            c = store[i]
            if alen >= depth:
                alen = depth - 1
            while a and length[link[a]] >= alen:
                a = link[a]
            p = a
            prev = -1
            while p != -1:
                v = nxt[p << _SHIFT | c]
                if v != prev:
                    count[v] -= 1
                    prev = v
                if best[p] == v:
                    best[p] = _STALE
                p = link[p]
            a = nxt[a << _SHIFT | c]
            alen += 1
        self.stale = True

    def _refresh_best(self, u: int) -> int:
        """Recompute the most frequent live child of ``u`` (ties: the most recent)."""
        nxt, count, lastpos = self.next, self.count, self.lastpos
        best, best_key = _NONE, (0, -1)
        e = self.first_edge[u]
        while e >= 0:
            v = nxt[u << _SHIFT | self.edge_token[e]]
            key = (count[v], lastpos[v])
            if count[v] > 0 and key > best_key:
                best, best_key = v, key
            e = self.edge_next[e]
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
        self, state: int, matched: int, limits: "_Limits", min_token_prob: float, beat: float
    ) -> tuple[float, list[int], int]:
        """Best draft continuing the suffixes of length <= ``matched`` held by ``state`` and its
        suffix chain. Returns (score, tokens, match length); only a score above ``beat`` counts."""
        length, link = self.length, self.link
        limit, mstar, reach = limits.limit, limits.mstar, limits.reach
        hi = min(matched, limits.max_match)
        best_score, best_tokens, best_m = beat, [], 0
        u = state
        while u > 0:
            lo = length[link[u]] + 1
            if hi >= lo:
                if reach[hi] <= best_score:
                    break
                m = mstar if lo <= mstar <= hi else (hi if hi < mstar else lo)
                if limit[m] > best_score:
                    score, tokens = self._path(u, limit[m], min_token_prob)
                    if score > best_score:
                        best_score, best_tokens, best_m = score, tokens, m
            u = link[u]
            hi = min(length[u], hi)
        return best_score, best_tokens, best_m

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


class _Limits:
    """Per-match-length draft budgets for one (max_spec_tokens, factor, offset, depth)."""

    def __init__(self, max_spec_tokens: int, factor: float, offset: float, depth: int):
        self.max_match = depth - 1
        # limit[m]: tokens a match of length m may draft (the path ends at depth ``depth``).
        self.limit = [0] + [
            max(0, min(max_spec_tokens, int(m * factor + offset + 1e-6), depth - m)) for m in range(1, depth)
        ]
        # mstar: the longest match with the largest limit; limit rises up to it and falls after.
        self.mstar = max(range(1, depth), key=lambda m: (self.limit[m], m))
        # reach[h]: the largest limit of any match length <= h.
        self.reach = [0] * depth
        for m in range(1, depth):
            self.reach[m] = max(self.reach[m - 1], self.limit[m])


class SuffixDecoding(Drafter):
    """SuffixDecoding drafter: local (this request) and global (earlier sequences) suffix indexes.

    One object serves many requests (``begin`` ... ``end``); finished requests are remembered in
    the global index (``remember_at_end``: "response" keeps the generated tokens, as the
    reference does; "sequence" keeps prompt and response; None keeps nothing). ``remember(tokens)``
    adds any sequence. The global index holds at most ``max_sequences`` sequences and
    ``max_tokens`` tokens, evicting the oldest first. Drafts are deterministic.
    """

    name = "suffix"
    cost_per_token = 0.0
    #: Evicted tokens stay in the global automaton (with zero counts) until they outnumber the
    #: live ones and this many; then it is rebuilt from the live sequences.
    rebuild_min_tokens = 65_536

    def __init__(
        self,
        max_depth: int = 64,
        max_spec_tokens: int = 16,
        max_spec_factor: float = 1.0,
        max_spec_offset: float = 0.0,
        min_token_prob: float = 0.1,
        max_sequences: int | None = 10_000,
        max_tokens: int | None = 1_000_000,
        remember_at_end: str | None = "response",
        use_local: bool = True,
        use_global: bool = True,
    ):
        if max_depth < 2:
            raise ValueError(f"max_depth must be >= 2, got {max_depth}")
        if max_spec_tokens < 1:
            raise ValueError(f"max_spec_tokens must be >= 1, got {max_spec_tokens}")
        if max_spec_factor < 0:
            raise ValueError(f"max_spec_factor must be >= 0, got {max_spec_factor}")
        if not 0 <= min_token_prob <= 1:
            raise ValueError(f"min_token_prob must be in [0, 1], got {min_token_prob}")
        if remember_at_end not in ("response", "sequence", None):
            raise ValueError(f"remember_at_end must be 'response', 'sequence' or None, got {remember_at_end!r}")
        for name, bound in (("max_sequences", max_sequences), ("max_tokens", max_tokens)):
            if bound is not None and bound < 1:
                raise ValueError(f"{name} must be >= 1 or None (no bound), got {bound}")
        self.max_depth = max_depth
        self.max_spec_tokens = max_spec_tokens
        self.max_spec_factor = max_spec_factor
        self.max_spec_offset = max_spec_offset
        self.min_token_prob = min_token_prob
        self.max_sequences = max_sequences
        self.max_tokens = max_tokens
        self.remember_at_end = remember_at_end
        self.use_local = use_local
        self.use_global = use_global
        # The drafter's own budget limits each draft (by match length and probabilities), so the
        # policy may ask for its full budget.
        self.preferred_k = max_spec_tokens
        self._limits: dict[int, _Limits] = {}
        self.global_index = SuffixIndex(max_depth)
        self._sequences: deque[tuple[int, int]] = deque()  # (start, end) in the global store
        self._live_tokens = 0
        self._dead_tokens = 0
        self._version = 0  # bumped whenever the global index changes
        self.local_index: SuffixIndex | None = None
        self._context: list[int] = []  # the request's tokens (the local index's sequence)
        self._prompt_len = 0
        self._active = False
        self._global_state = (0, 0)
        self._global_upto = 0  # context tokens followed by the global match
        self._global_version = -1
        #: What the last draft came from: {"source": "local"|"global"|None, "match": m, "score": s}.
        self.last_draft: dict = {}

    # -- the global store ----------------------------------------------------------------------
    @property
    def stored_sequences(self) -> int:
        return len(self._sequences)

    @property
    def stored_tokens(self) -> int:
        return self._live_tokens

    def remember(self, tokens: Sequence[int]) -> None:
        """Keep ``tokens`` in the global index (the oldest sequences go when a bound is exceeded;
        a sequence longer than ``max_tokens`` keeps its last ``max_tokens`` tokens)."""
        tokens = [int(t) for t in tokens]
        if self.max_tokens is not None and len(tokens) > self.max_tokens:
            tokens = tokens[-self.max_tokens :]
        if not tokens:
            return
        index = self.global_index
        start = index.start_sequence()
        index.extend(tokens)
        self._sequences.append((start, start + len(tokens)))
        self._live_tokens += len(tokens)
        self._version += 1
        while (self.max_sequences is not None and len(self._sequences) > self.max_sequences) or (
            self.max_tokens is not None and self._live_tokens > self.max_tokens
        ):
            start, end = self._sequences.popleft()
            index.remove(start, end)
            self._live_tokens -= end - start
            self._dead_tokens += end - start
        if self._dead_tokens > max(self._live_tokens, self.rebuild_min_tokens):
            self._rebuild_global()

    def forget(self) -> None:
        """Empty the global index."""
        self.global_index = SuffixIndex(self.max_depth)
        self._sequences.clear()
        self._live_tokens = self._dead_tokens = 0
        self._version += 1

    def _rebuild_global(self) -> None:
        old = self.global_index
        fresh = SuffixIndex(self.max_depth)
        sequences: deque[tuple[int, int]] = deque()
        for start, end in self._sequences:
            new_start = fresh.start_sequence()
            fresh.extend(old.store[start:end])
            sequences.append((new_start, new_start + end - start))
        self.global_index, self._sequences = fresh, sequences
        self._dead_tokens = 0
        self._version += 1

    # -- the request ---------------------------------------------------------------------------
    def begin(self, prompt: Sequence[int], hidden=None) -> None:
        prompt = [int(t) for t in prompt]
        old = self._context
        if self.local_index is not None and 0 < len(old) <= len(prompt) and prompt[: len(old)] == old:
            # The prompt continues the previous request (a conversation's next turn): extend.
            self.local_index.extend(prompt[len(old) :])
        else:
            self.local_index = SuffixIndex(self.max_depth, compact=False)
            self.local_index.start_sequence()
            self.local_index.extend(prompt)
        self._context = prompt
        self._prompt_len = len(prompt)
        self._active = True
        self._global_version = -1

    def observe(self, tokens: Sequence[int], hidden=None) -> None:
        if self.local_index is None:
            raise ValueError("observe() before begin(): start the request with begin(prompt)")
        tokens = [int(t) for t in tokens]
        self._context.extend(tokens)
        self.local_index.extend(tokens)

    def end(self) -> None:
        if self._active and self.remember_at_end is not None:
            keep = self._context[self._prompt_len :] if self.remember_at_end == "response" else self._context
            self.remember(keep)
        self._active = False

    def _sync(self, context: Sequence[int]) -> None:
        """Make the local index hold ``context`` (it normally does, through begin/observe)."""
        n = len(self._context)
        if self.local_index is not None and len(context) == n and (n == 0 or context[-1] == self._context[-1]):
            return
        if self.local_index is not None and len(context) > n and list(context[:n]) == self._context:
            self.observe(context[n:])
            return
        active = self._active
        self.local_index = None
        self._context = []
        self.begin(context)
        self._active = active

    def _global_match(self) -> tuple[int, int]:
        index, context = self.global_index, self._context
        if self._global_version != self._version or len(context) < self._global_upto:
            self._global_state = index.match(context[-self.max_depth :])
            self._global_version = self._version
        else:
            self._global_state = index.match(context[self._global_upto :], *self._global_state)
        self._global_upto = len(context)
        return self._global_state

    # -- drafting ------------------------------------------------------------------------------
    def draft(self, context: Sequence[int], k: int) -> Draft:
        self._sync(context)
        budget = min(k, self.max_spec_tokens)
        n = len(self._context)
        if budget <= 0 or n < 2:
            self.last_draft = {"source": None, "match": 0, "score": 0.0}
            return Draft([])
        limits = self._limits.get(budget)
        if limits is None:
            limits = self._limits[budget] = _Limits(budget, self.max_spec_factor, self.max_spec_offset, self.max_depth)
        longest = n - 1  # the reference matches at most len(context) - 1 tokens
        score, tokens, match, source = 0.0, [], 0, None
        if self.use_local:
            index = self.local_index
            score, tokens, match = index.speculate(
                index.anchor, min(index.anchor_len, longest), limits, self.min_token_prob, 0.0
            )
            source = "local" if tokens else None
        if self.use_global and self._live_tokens:
            state, matched = self._global_match()
            if matched:
                g_score, g_tokens, g_match = self.global_index.speculate(
                    state, min(matched, longest), limits, self.min_token_prob, score
                )
                if g_score > score:
                    score, tokens, match, source = g_score, g_tokens, g_match, "global"
        self.last_draft = {"source": source, "match": match, "score": score}
        return Draft(list(tokens))
