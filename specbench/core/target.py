"""What the decode loop decodes against: a model with its caches, or a recorded output.

A target answers three questions for the loop: the first token after the prompt (``prefill``),
the next token without a draft (``queue`` a plain step, ``take`` its token), and which of a draft's
tokens the model keeps (``verify``, which also rolls the caches back past the rejected ones).
``ModelTarget`` runs an mlx-lm model; the simulator (``specbench.simulate.simulate``) replays a
recorded output.

``Pipeline`` wraps a target for the decode loop (what makes plain decoding fast around speculation). Within
a stretch of plain steps it queues step i + 1 before reading step i's token, as mlx-lm's ``generate_step``
does; past a stretch that more tokens follow it queues one more step and keeps it (the next stretch goes on
from it, so the pipeline never drains between stretches; a draft takes its token first, through ``ready``).
A probe (``Speculate.probing``: a verification expected to be rejected) has the plain step after a full
rejection queued while it verifies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generation_stream, wired_limit
from mlx_lm.models.cache import KVCache, make_prompt_cache

from specbench.core.accept import draw_by_position
from specbench.core.draft import Draft
from specbench.core.experts import ExpertCounter
from specbench.core.forward import context_length, vocab_size
from specbench.core.options import GenerateOptions
from specbench.core.tree import depths, tree_attention
from specbench.core.verify import FAST, CacheRollback, Verifier, accept_greedy, accept_tree_greedy, forward, greedy


@dataclass
class Step:
    """Tokens one forward produced: ``tokens`` (one for a plain step; accepted drafts then the
    model's own token for a verification), the hidden rows behind them when asked for, and the
    log record's extra columns."""

    tokens: list[int]
    hidden: mx.array | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    accepted: int = 0
    accept_probs: list[float] = field(default_factory=list)
    #: For a token tree: the accepted nodes, root to leaf.
    path: list[int] = field(default_factory=list)
    #: A verification asked to ``queue_rejected`` that rejected every draft: the plain step after it, queued.
    queued: Any = None


class Target(Protocol):
    """What the decode loop needs of a model (or of a recorded output), one step at a time."""

    vocab: int | None
    context_limit: int | None
    #: Output index of a known stop (a recorded output that ended on one); None for a model.
    stop_index: int | None

    def running(self) -> contextlib.AbstractContextManager[Any]: ...

    def prefill(self, prompt: list[int], cached: int) -> tuple[Step, mx.array | None]: ...

    def queue(self, position: int) -> Any:
        """Start the plain step at output ``position`` after the last token queued or verified (not read)."""

    def take(self, queued: Any) -> Step:
        """The plain step ``queue`` started, read."""

    def verify(
        self,
        draft_tokens: list[int],
        draft_probs: mx.array | None,
        position: int,
        parents: list[int] | None = None,
        queue_rejected: bool = False,
    ) -> Step: ...


@contextlib.contextmanager
def generation_context(
    model: nn.Module, verifier: Verifier, speculative: bool, counting: bool
) -> Iterator[ExpertCounter | None]:
    """What generations decode inside: wired memory, mlx-lm's generation stream, the verifier's way of running plain
    steps (and, ``speculative``, what it prepares per generation) and, when ``counting``, an expert counter."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(wired_limit(model, [generation_stream]))
        stack.enter_context(mx.stream(generation_stream))
        stack.enter_context(verifier.decoding())
        if speculative:
            stack.enter_context(verifier.running())
        yield stack.enter_context(ExpertCounter(model)) if counting else None


class ModelTarget:
    """An mlx-lm model and its caches: prefill, lazy plain steps, one-forward verification."""

    stop_index = None

    def __init__(
        self,
        model: nn.Module,
        options: GenerateOptions,
        verifier: Verifier = FAST,
        prompt_cache: list[Any] | None = None,
        eos_ids: Sequence[int] = (),
        needs_hidden: bool = False,
        speculative: bool = False,
    ):
        self.model = model
        self.options = options
        self.verifier = verifier
        self.vocab = vocab_size(model)
        self.context_limit = context_length(model)
        self.cache = prompt_cache if prompt_cache is not None else make_prompt_cache(model)
        self.held = int(getattr(self.cache[0], "offset", 0) or 0) if prompt_cache is not None else 0
        self.eos_ids = list(eos_ids)
        self.needs_hidden = needs_hidden
        self.speculative = speculative
        self.rollback = CacheRollback(self.cache, model) if speculative else None
        self.counter: ExpertCounter | None = None
        #: The last token queued or verified (an unread array while a plain step computes it).
        self.last: mx.array | int = 0

    def cached_tokens(self, prompt_length: int) -> int:
        """Prompt tokens the given cache already holds (a conversation's history): a cache holding
        fewer tokens than the prompt holds its first tokens; one holding as many or more is a
        context the prompt continues."""
        return self.held if self.held < prompt_length else 0

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """``generation_context``, with expert counting when asked for, and a fresh sampler."""
        with generation_context(self.model, self.verifier, self.speculative, self.options.count_experts) as counter:
            self.counter = counter
            self.sampler = self.options.sampling.sampler()
            yield

    def _forward(self, inputs: mx.array, verifier: Verifier | None = None) -> tuple[mx.array, mx.array | None]:
        run = verifier.forward if verifier is not None else forward
        out = run(self.model, inputs, self.cache, self.needs_hidden)
        return out if self.needs_hidden else (out, None)

    def _extra(self) -> dict[str, Any]:
        """Expert counts of the forward just built, when counting."""
        return {"experts": self.counter.take()} if self.counter is not None else {}

    def _mask_eos(self, logits: mx.array, position: int, parents: list[int] | None = None) -> mx.array:
        """Suppress EOS in rows whose output position is below ``min_tokens``: ``position`` plus the row's index,
        or for a token tree (``parents``) its depth."""
        if position >= self.options.min_tokens or not self.eos_ids:
            return logits
        column = mx.zeros((logits.shape[-1],), dtype=mx.bool_)
        column[mx.array(self.eos_ids)] = True
        offsets = mx.arange(logits.shape[-2]) if parents is None else mx.array([0] + depths(parents))
        row = (position + offsets)[:, None] < self.options.min_tokens
        return mx.where(row & column, mx.array(-float("inf"), logits.dtype), logits)

    def _pick(self, logits: mx.array, position: int) -> mx.array:
        """One token from the last row of ``logits`` [1, w, vocab], as mlx-lm picks it; sampled by position, the
        draw of output ``position`` (as a verification draws it)."""
        logits = self._mask_eos(logits[:, -1, :], position)
        if self.options.temperature == 0:
            return greedy(logits)[0]
        seed = self.options.seed
        if self.options.sample_by_position and seed is not None:  # checked: sampling by position has a seed
            return draw_by_position(self.options.sampling.probs(logits), seed, [position])[0]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return self.sampler(logprobs)[0]

    def draws(self, p: mx.array, positions: Sequence[int]) -> list[int] | None:
        """The target's token at each row of ``p`` (at output ``positions``) when sampling by position, else None
        (the rule draws its own)."""
        seed = self.options.seed
        if not self.options.sample_by_position or seed is None:
            return None
        return cast(list[int], draw_by_position(p, seed, positions).tolist())

    def prefill(self, prompt: list[int], cached: int) -> tuple[Step, mx.array | None]:
        """The prompt pass (in chunks of ``prefill_step_size``): the first token, and the prompt's
        hidden states when asked for."""
        ids = mx.array(prompt, dtype=mx.uint32)
        hidden_parts = []
        done = cached
        while len(prompt) - done > 1:
            n = min(self.options.prefill_step_size, len(prompt) - done - 1)
            _, hidden = self._forward(ids[None, done : done + n])
            if hidden is not None:
                hidden_parts.append(hidden)
                mx.eval(hidden)
            mx.eval([c.state for c in self.cache])
            done += n
        logits, hidden = self._forward(ids[None, done:])
        token = self._pick(logits, 0)
        extra = self._extra()
        mx.eval(token)
        self.last = token
        prompt_hidden = mx.concatenate(hidden_parts, axis=1) if hidden_parts else None
        return Step([int(token.item())], hidden, extra), prompt_hidden

    def _plain_step(self, y: mx.array, position: int) -> tuple[mx.array, mx.array | None, dict[str, Any]]:
        if self.speculative:
            self.verifier.before_plain_step(self.cache)
        logits, hidden = self._forward(mx.reshape(y, (1, 1)))
        return self._pick(logits, position), hidden, self._extra()

    def queue(self, position: int) -> tuple[mx.array, mx.array | None, dict[str, Any]]:
        """The plain step at output ``position``, from the last token, started (``mx.async_eval``), unread."""
        last = self.last if isinstance(self.last, mx.array) else mx.array(self.last, dtype=mx.uint32)
        queued = self._plain_step(last, position)
        mx.async_eval(queued[0])
        self.last = queued[0]
        return queued

    def take(self, queued: tuple[mx.array, mx.array | None, dict[str, Any]]) -> Step:
        token, hidden, extra = queued
        return Step([int(token.item())], hidden, extra)

    def verify(
        self,
        draft_tokens: list[int],
        draft_probs: mx.array | None,
        position: int,
        parents: list[int] | None = None,
        queue_rejected: bool = False,
    ) -> Step:
        """One forward over the last token and the draft; the accept rule; the caches rolled back
        past the rejected drafts. With ``parents`` the draft is a token tree (``verify_tree``).
        ``queue_rejected`` (a probe expected to fail): while the forward runs, the plain step after a
        full rejection is queued (``_queue_rejected``); handed back (``Step.queued``) when every draft is
        rejected, dropped otherwise."""
        if parents is not None:
            return self.verify_tree(draft_tokens, draft_probs, position, parents)
        last = int(self.last.item()) if isinstance(self.last, mx.array) else int(self.last)
        inputs = mx.array([[last] + draft_tokens], dtype=mx.uint32)
        self.rollback.before_verify(inputs.shape[1])
        logits, hidden = self._forward(inputs, self.verifier)
        extra = self._extra()
        logits = self._mask_eos(logits[0], position)
        queued = self._queue_rejected(logits, len(draft_tokens), position) if queue_rejected else None
        if self.options.temperature == 0:
            accepted, tokens = accept_greedy(draft_tokens, self.verifier.greedy(logits))
            probs: list[float] = []
        else:
            p = self.options.sampling.probs(logits)
            draws = self.draws(p, range(position, position + len(draft_tokens) + 1))
            accepted, tokens, probs = self.options.rule.path(p, draft_tokens, draft_probs, draws)
        rejected = len(draft_tokens) - accepted
        if queued is not None and accepted == 0:  # the caches are rolled back already, the next step on its way
            self.last = queued[1][0]
            return Step(tokens, hidden, extra, accepted, probs, queued=queued[1])
        if queued is not None:  # a draft accepted after all: back to the verification's caches
            for c, (keys, values, offset) in zip(self.cache, queued[0]):
                c.keys, c.values, c.offset = keys, values, offset
            self.verifier.after_rewind(self.cache, 0)  # the layout the queued step gave them is undone
        self.rollback.rewind(rejected)
        if rejected:
            self.verifier.after_rewind(self.cache, rejected)
        self.last = tokens[-1]
        return Step(tokens, hidden, extra, accepted, probs)

    def _queue_rejected(
        self, logits: mx.array, drafted: int, position: int
    ) -> tuple[list[tuple[Any, Any, int]], tuple[mx.array, mx.array | None, dict[str, Any]]] | None:
        """Before a verification's tokens are read: roll the caches back as a full rejection would, and
        queue the plain step from the model's first token (greedy, unread). Returns the caches' state
        after the verification (to restore when a draft is accepted after all) and the queued step; None
        where that cannot be done (sampling, recurrent state, caches other than mlx-lm's ``KVCache``)."""
        if (
            self.options.temperature != 0
            or drafted == 0
            or self.rollback.recorder is not None
            or any(type(c) is not KVCache for c in self.cache)
        ):
            return None
        # views of the values now: the queued step and a rollback write into these arrays in place
        saved = [(c.keys[...], c.values[...], c.offset) for c in self.cache]
        first = greedy(logits[:1])
        self.rollback.rewind(drafted)
        self.verifier.after_rewind(self.cache, drafted)
        pending = self._plain_step(first, position + 1)
        mx.async_eval(pending[0])
        return saved, pending

    def verify_tree(self, tokens: list[int], probs: mx.array | None, position: int, parents: list[int]) -> Step:
        """One forward over the last token and a token tree (tree mask, per-depth positions); the
        longest accepted path; the caches compacted to it; hidden rows along it."""
        last = int(self.last.item()) if isinstance(self.last, mx.array) else int(self.last)
        inputs = mx.array([[last] + tokens], dtype=mx.uint32)
        width = inputs.shape[1]
        with tree_attention(self.model, self.cache, parents):
            logits, hidden = self._forward(inputs, self.verifier)
        extra = self._extra()
        logits = self._mask_eos(logits[0], position, parents)
        if self.options.temperature == 0:
            path, emitted = accept_tree_greedy(tokens, parents, self.verifier.greedy(logits))
            ratios: list[float] = []
        else:
            p = self.options.sampling.probs(logits)
            draws = self.draws(p, [position + d for d in [0, *depths(parents)]])
            path, emitted, ratios = self.options.rule.tree(p, tokens, parents, probs, draws)
        keep = [0] + [node + 1 for node in path]
        self.rollback.compact(width, keep)
        if width > len(keep):
            self.verifier.after_rewind(self.cache, width - len(keep))
        if hidden is not None:
            hidden = hidden[:, mx.array(keep, dtype=mx.int32)]
        self.last = emitted[-1]
        return Step(emitted, hidden, extra, len(path), ratios, path)


class Pipeline:
    """``target`` with its plain steps pipelined, for a generation whose last output index is ``end - 1``."""

    def __init__(self, target: Target, end: int):
        self.inner = target
        self.end = end
        self.vocab: int | None = target.vocab
        self.context_limit: int | None = target.context_limit
        self.stop_index: int | None = target.stop_index
        #: The plain step queued past the last stretch and its output position.
        self._ahead: tuple[Any, int] | None = None

    def running(self) -> contextlib.AbstractContextManager[Any]:
        return self.inner.running()

    def prefill(self, prompt: list[int], cached: int) -> tuple[Step, mx.array | None]:
        return self.inner.prefill(prompt, cached)

    def plain_steps(self, position: int, n: int) -> Iterator[Step]:
        """``n`` plain steps from output ``position``, each queued before the token before it is read; when
        tokens follow the last, the step after it is queued too and kept."""
        more = position + n < self.end
        if self._ahead is not None and self._ahead[1] == position:
            pending, self._ahead = self._ahead[0], None
        else:
            self._check_taken()
            pending = self.inner.queue(position)
        for i in range(n):
            current = pending
            if i + 1 < n or more:
                pending = self.inner.queue(position + i + 1)
            if i + 1 == n and more:
                self._ahead = (pending, position + n)
            yield self.inner.take(current)

    def ready(self) -> Step | None:
        """The plain step queued past the last stretch, read (None when none is): its token comes before a draft."""
        if self._ahead is None:
            return None
        (queued, _), self._ahead = self._ahead, None
        return self.inner.take(queued)

    def verify(self, draft: Draft, position: int, probing: bool = False) -> Step:
        """The target's verification of ``draft`` (a path or a token tree) after output ``position``; a probe's
        full rejection leaves the plain step after it queued."""
        self._check_taken()
        if draft.parents is not None:  # a token tree
            return self.inner.verify(draft.tokens, draft.probs, position, parents=draft.parents)
        step = self.inner.verify(draft.tokens, draft.probs, position, queue_rejected=probing)
        if step.queued is not None:
            self._ahead = (step.queued, position + 1)
        return step

    def _check_taken(self) -> None:
        if self._ahead is not None:
            raise RuntimeError("a plain step is still queued past the last stretch: take its token with ready()")
