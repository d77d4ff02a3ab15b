"""MTP drafting: the model's own multi-token-prediction head proposes the next tokens.

The head reads pairs (hidden state at position i, token i+1) and predicts token i+2. The first
draft token comes from the last verified position's hidden state (given by the engine); further
ones feed the head its own output state. The head keeps a KV cache over the context: after each
verification its speculative entries are dropped and it is fed the model's real hidden states
for the accepted positions, so it never drifts from the model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specbench.core.draft import Draft, Drafter
from specbench.core.forward import logits_from_hidden, text_model, vocab_size
from specbench.core.policy_args import MAX_DRAFT_LENGTH, real, whole
from specbench.core.tree import row_attention
from specbench.drafters.registry import DrafterInputs, register_drafter
from specbench.models.mtp.attach import attach_mtp, get_head, shipped_head
from specbench.models.mtp.head import MtpModule
from specbench.models.synthetic import parameter_bytes


class MtpHead(Drafter):
    """Drafts with an MTP head attached to the model (``specbench.attach_mtp``).

    ``temperature`` 0 drafts greedily (deterministic drafts); above 0 it samples from the head's
    softmax at that temperature and reports those distributions for lossless verification.
    ``tree_width`` > 1 (greedy drafting only; name "mtp-tree") drafts a token tree: the greedy chain,
    and at each of its depths the head's next ``tree_width - 1`` most probable tokens as leaves beside
    the chain's token (``k`` nodes: a chain of ``k // tree_width``). ``top_k`` > 0 (greedy drafting
    only; name "mtp-dynamic-tree") drafts EAGLE-2's dynamic tree of at most ``tree_depth`` levels
    (``_dynamic_tree``).
    """

    name = "mtp"
    needs_hidden = True

    def __init__(
        self,
        model: nn.Module,
        head: MtpModule | None = None,
        temperature: float = 0.0,
        preferred_k: int = 3,
        tree_width: int = 1,
        top_k: int = 0,
        tree_depth: int = 4,
    ):
        vocab = vocab_size(model)
        real("temperature", temperature, 0.0)
        whole("preferred_k", preferred_k, 1, MAX_DRAFT_LENGTH)
        whole("tree_width", tree_width, 1, vocab)
        whole("top_k", top_k, 0, vocab)
        whole("tree_depth", tree_depth, 1, MAX_DRAFT_LENGTH)
        if top_k and tree_width > 1:
            raise ValueError("choose one MTP tree: the static one (tree_width > 1) or the dynamic one (top_k > 0)")
        if (tree_width > 1 or top_k) and temperature > 0:
            raise ValueError("MTP token trees draft greedily: use temperature=0 with tree_width > 1 or top_k > 0")
        self.tree_width = tree_width
        self.top_k, self.tree_depth = top_k, tree_depth
        self.tree = tree_width > 1 or bool(top_k)
        #: The last dynamic tree's nodes' cumulative head probabilities (in draft order).
        self.last_scores: list[float] = []
        if self.tree:
            self.name = "mtp-dynamic-tree" if top_k else "mtp-tree"
        self.model = model
        self.head = head if head is not None else get_head(model)
        self.temperature = float(temperature)
        self.sampled_drafts = self.temperature > 0
        self.preferred_k = preferred_k
        lm = text_model(model)
        self.embed = lm.model.embed_tokens
        self.embed_dtype = self.head.norm.weight.dtype
        # Drafting reads the head's weights and the output head, a decode step reads everything.
        out_head = getattr(lm, "lm_head", None) or self.embed
        total = parameter_bytes(model) - parameter_bytes(self.head)
        self.cost_per_token = (parameter_bytes(self.head) + parameter_bytes(out_head)) / max(total, 1)
        self._reset([])

    def _reset(self, prompt: Sequence[int]) -> None:
        self.cache = self.head.make_cache()
        self.tokens: list[int] = [int(t) for t in prompt]
        self.hidden_rows: list[mx.array] = []  # hidden states of positions fed .. known-1
        self.known = 0  # positions whose hidden state is known
        self.fed = 0  # positions fed to the head's cache (pairs (h_i, token i+1))
        self.speculative = 0  # head cache entries beyond ``fed`` from the last draft

    def begin(self, prompt: Sequence[int], hidden: mx.array | None = None) -> None:
        self._reset(prompt)
        if hidden is not None and hidden.shape[1] > 0:
            self._add_hidden(0, hidden)

    def _add_hidden(self, start: int, hidden: mx.array) -> None:
        skip = self.known - start
        if skip < 0:
            raise ValueError(f"hidden states of positions {self.known}..{start - 1} were never given")
        if skip < hidden.shape[1]:
            rows = hidden[:, skip:] if skip else hidden
            self.hidden_rows.append(rows.reshape(1, -1, rows.shape[-1]))
            self.known += rows.shape[1]

    def observe(self, tokens: Sequence[int], hidden: mx.array | None = None) -> None:
        if hidden is None:
            raise ValueError("MtpHead needs the model's hidden states: run it through speculative_generate")
        start = len(self.tokens) - 1  # hidden[j] is the state at the position before tokens[j]
        self.tokens.extend(int(t) for t in tokens)
        self._add_hidden(start, hidden[:, : len(tokens)])

    def _drop_speculative(self) -> None:
        if self.speculative:
            for c in self.cache:
                c.trim(self.speculative)
            self.speculative = 0

    def draft(self, context: Sequence[int], k: int) -> Draft:
        self._drop_speculative()
        if len(context) != len(self.tokens) or k <= 0:
            return Draft([])
        ready = min(self.known, len(self.tokens) - 1)  # pairs (h_i, token i+1) for i < ready
        if ready <= self.fed:
            return Draft([])
        n = ready - self.fed
        hidden = mx.concatenate(self.hidden_rows, axis=1) if len(self.hidden_rows) > 1 else self.hidden_rows[0]
        pending, rest = hidden[:, :n], hidden[:, n:]
        self.hidden_rows = [rest] if rest.shape[1] else []
        next_tokens = mx.array([self.tokens[self.fed + 1 : ready + 1]], dtype=mx.uint32)
        chain, out = self.head(self.embed(next_tokens), pending.astype(self.embed_dtype), self.cache)
        self.fed = ready
        chain, out = chain[:, -1:], out[:, -1:]
        if self.top_k:
            return self._dynamic_tree(chain, out, k)
        tokens: list[int] = []
        parents: list[int] = []
        probs: list[mx.array] = []
        depth = max(1, k // self.tree_width)  # a static tree holds tree_width nodes per depth
        for j in range(depth):
            logits = logits_from_hidden(self.model, out)[0, -1].astype(mx.float32)
            if self.temperature > 0:
                probs.append(mx.softmax(logits / self.temperature, axis=-1))
                token = int(mx.random.categorical(logits / self.temperature).item())
            else:
                token = int(mx.argmax(logits).item())
            parent = len(tokens) - 1
            if self.tree_width > 1:  # the next most probable tokens, leaves beside the chain's
                ranked = [int(t) for t in mx.argsort(-logits)[: self.tree_width].tolist()]
                leaves = [t for t in ranked if t != token][: self.tree_width - 1]
                tokens += leaves
                parents += [parent] * len(leaves)
            tokens.append(token)
            parents.append(parent)
            if j + 1 < depth:
                chain, out = self.head(self.embed(mx.array([[token]], dtype=mx.uint32)), chain, self.cache)
                self.speculative += 1
        return Draft(tokens, mx.stack(probs) if probs else None, parents=parents if self.tree_width > 1 else None)

    def _log_probs(self, out: mx.array) -> mx.array:
        logits = logits_from_hidden(self.model, out).astype(mx.float32)
        return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

    def _dynamic_tree(self, chain: mx.array, out: mx.array, budget: int) -> Draft:
        """EAGLE-2's dynamic tree from the root's head state (``chain``, ``out``): candidates scored by
        cumulative log probability; each level's best ``top_k`` expanded in one head call whose rows
        attend to the context and their own expanded ancestors (``row_attention``), at their depth's
        position; the best ``budget`` candidates drafted (a child never outscores its parent, so they
        form a tree), parents before children."""
        top_k = self.top_k
        modules = [layer.self_attn for layer in self.head.layers]
        base = self.cache[0].offset  # the head's position of the first drafted token's pair
        # Candidates: (log probability, token, parent candidate or -1, depth).
        cands: list[tuple[float, int, int, int]] = []
        column: dict[int, int] = {}  # expanded candidate -> its speculative head-cache entry
        chained: dict[int, mx.array] = {-1: chain}  # expanded candidate (-1: the root) -> its chained state

        def add_children(parents: list[int], log_probs: mx.array) -> None:
            """Each parent's ``top_k`` most probable children (log_probs: one row per parent)."""
            top = mx.argpartition(-log_probs, kth=top_k - 1, axis=-1)[:, :top_k]
            values = mx.take_along_axis(log_probs, top, axis=-1)
            for parent, tokens, lps in zip(parents, top.tolist(), values.tolist()):
                prior = cands[parent][0] if parent >= 0 else 0.0
                depth = cands[parent][3] + 1 if parent >= 0 else 1
                for t, lp in zip(tokens, lps):
                    cands.append((prior + min(0.0, lp), int(t), parent, depth))

        add_children([-1], self._log_probs(out)[0, -1:])
        level = list(range(len(cands)))
        for depth in range(1, self.tree_depth):
            level = sorted(level, key=lambda c: -cands[c][0])[:top_k]
            rows, spec = len(level), len(column)
            mask = [[True] * base + [False] * (spec + rows) for _ in range(rows)]
            for i, c in enumerate(level):
                mask[i][base + spec + i] = True
                a = cands[c][2]
                while a >= 0:
                    mask[i][base + column[a]] = True
                    a = cands[a][2]
            tokens = mx.array([[cands[c][1] for c in level]], dtype=mx.uint32)
            states = mx.concatenate([chained[cands[c][2]] for c in level], axis=1).astype(self.embed_dtype)
            with row_attention(modules, self.cache, mx.array(mask), [base + depth - 1] * rows):
                chain_rows, head_out = self.head(self.embed(tokens), states, self.cache)
            self.speculative += rows
            first = len(cands)
            for i, c in enumerate(level):
                column[c] = spec + i
                chained[c] = chain_rows[:, i : i + 1]
            add_children(level, self._log_probs(head_out)[0])
            level = list(range(first, len(cands)))
        chosen = sorted(range(len(cands)), key=lambda c: (-cands[c][0], cands[c][3]))[:budget]
        rank = {c: r for r, c in enumerate(chosen)}
        chosen.sort(key=lambda c: (cands[c][3], rank[c]))
        index = {c: i for i, c in enumerate(chosen)}
        self.last_scores = [math.exp(cands[c][0]) for c in chosen]
        return Draft(
            [cands[c][1] for c in chosen], parents=[index[cands[c][2]] if cands[c][2] >= 0 else -1 for c in chosen]
        )

    def end(self) -> None:
        self._reset([])


def mtp_head_for(model: nn.Module, model_name: str | None = None, **kwargs: Any) -> MtpHead:
    """An MtpHead for ``model``: its attached head, or the head shipped for ``model_name``."""
    if not (isinstance(model, dict) and "mtp" in model):
        path = shipped_head(model_name) if model_name else None
        if path is None and model_name and (Path(model_name).expanduser() / "mtp.safetensors").is_file():
            path = Path(model_name).expanduser() / "mtp.safetensors"  # a folder with a trained head
        if path is None:
            raise ValueError(
                f"model {model_name or ''} has no MTP head: attach one with specbench.attach_mtp(model, path) "
                f"(the original checkpoint, or a head from `specbench train-mtp`)"
            )
        attach_mtp(model, path)
    return MtpHead(model, **kwargs)


@register_drafter(
    "mtp", "the model's multi-token-prediction head (attached, or shipped for it)", needs=("model", "head")
)
def _mtp(inputs: DrafterInputs) -> MtpHead:
    return mtp_head_for(inputs.model, inputs.model_name)
