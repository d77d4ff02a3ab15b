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

Each index is a ``SuffixIndex`` (``suffix_index``) whose counts equal the reference's node counts, so drafts
and scores are the reference's. Two choices differ: among children with equal counts the most recent one wins
(the reference takes an unspecified one), and the response being generated joins the global index only when the
request ends (the reference adds it while generating; here the local index already holds it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from specbench.core.draft import Draft, Drafter
from specbench.core.policy_args import MAX_DRAFT_LENGTH, real, whole
from specbench.core.tree import is_path
from specbench.drafters.registry import DrafterInputs, register_drafter
from specbench.drafters.suffix_backoff import backoff_tree
from specbench.drafters.suffix_index import DraftLimits, SuffixIndex


@dataclass(eq=False)
class SuffixDecoding(Drafter):
    """SuffixDecoding drafter: local (this request) and global (earlier sequences) suffix indexes.

    One object serves many requests (``begin`` ... ``end``); finished requests are remembered in
    the global index (``remember_at_end``: "response" keeps the generated tokens, as the
    reference does; "sequence" keeps prompt and response; None keeps nothing). ``remember(tokens)``
    adds any sequence. The global index holds at most ``max_sequences`` sequences and
    ``max_tokens`` tokens, evicting the oldest first. Drafts are deterministic.

    ``tree`` drafts token trees, verified by the engine in one forward with a tree mask (name
    "suffix-tree"): ``True`` or "backoff" grows the back-off tree of ``specbench.drafters.suffix_backoff``
    (the path draft as its spine, up to max_spec_tokens nodes); "reference" grows the reference's tree from
    the best match alone (``SuffixIndex._tree``).
    """

    name = "suffix"
    #: Evicted tokens stay in the global automaton (with zero counts) until they outnumber the
    #: live ones and this many; then it is rebuilt from the live sequences.
    rebuild_min_tokens = 65_536

    max_depth: int = 64
    max_spec_tokens: int = 16
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    max_sequences: int | None = 10_000
    max_tokens: int | None = 1_000_000
    remember_at_end: str | None = "response"
    use_global: bool = True
    tree: bool | str = False

    def __post_init__(self) -> None:
        whole("max_depth", self.max_depth, 2)
        whole("max_spec_tokens", self.max_spec_tokens, 1, MAX_DRAFT_LENGTH)
        real("max_spec_factor", self.max_spec_factor, 0.0)
        real("max_spec_offset", self.max_spec_offset)
        real("min_token_prob", self.min_token_prob, 0.0, 1.0)
        for arg, bound in (("max_sequences", self.max_sequences), ("max_tokens", self.max_tokens)):
            if bound is not None:
                whole(arg, bound, 1)
        if self.remember_at_end not in ("response", "sequence", None):
            raise ValueError(f"remember_at_end must be 'response', 'sequence' or None, got {self.remember_at_end!r}")
        if self.tree not in (False, True, "backoff", "reference"):
            raise ValueError(f"tree must be False, True, 'backoff' or 'reference', got {self.tree!r}")
        self.tree_rule = "backoff" if self.tree is True else (self.tree or None)
        self.tree = self.tree_rule is not None
        if self.tree:
            self.name = "suffix-tree"
        # The drafter's own budget limits each draft (by match length and probabilities), so the
        # policy may ask for its full budget; a tree holds at most this many nodes, a path this many tokens.
        self.preferred_k = self.max_draft = self.max_spec_tokens
        self._limits: dict[int, DraftLimits] = {}
        self.global_index = SuffixIndex(self.max_depth)
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
        self._sequences.append(index.start_sequence(tokens))
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

    def _rebuild_global(self) -> None:
        old, self.global_index = self.global_index, SuffixIndex(self.max_depth)
        self._sequences = deque(
            self.global_index.start_sequence(old.store[start:end]) for start, end in self._sequences
        )
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
            self.local_index.start_sequence(prompt)
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
        reference = self.tree_rule == "reference"
        limits = self._limits.get(budget * 2 + reference)
        if limits is None:
            limits = DraftLimits(budget, self.max_spec_factor, self.max_spec_offset, self.max_depth, reference)
            self._limits[budget * 2 + reference] = limits
        longest = n - 1  # the reference matches at most len(context) - 1 tokens
        index = self.local_index
        starts = [("local", (index, index.anchor, min(index.anchor_len, longest)))]  # global only when better
        if self.use_global and self._live_tokens:
            state, matched = self._global_match()
            if matched:
                starts.append(("global", (self.global_index, state, min(matched, longest))))
        score, tokens, match, parents, source, start = 0.0, [], 0, None, None, None
        for name, at in starts:
            found = at[0].speculate(*at[1:], limits, self.min_token_prob, score, reference)
            if found[0] > score:
                (score, tokens, match, parents), source, start = found, name, at
        if self.tree_rule == "backoff" and tokens:
            tokens, parents = backoff_tree(*start, tokens, budget, self.min_token_prob)
            if is_path(parents):
                parents = None
        self.last_draft = {"source": source, "match": match, "score": score}
        return Draft(list(tokens), parents=list(parents) if parents else None)


@register_drafter(
    "suffix",
    "SuffixDecoding: suffix matches in this request and in earlier ones (a global index)",
    parameter="K: drafts of up to K tokens (default 16; Auto then verifies, and exact mode calibrates, widths up to "
    "K + 1 only)",
)
def _suffix(inputs: DrafterInputs) -> SuffixDecoding:
    longest = inputs.value or inputs.max_draft
    return SuffixDecoding(max_spec_tokens=longest) if longest else SuffixDecoding()
