"""Batched decoding: several requests decode together, each drafting its own length.

Each step every active request asks its policy for a draft length k_i (0 allowed) and its drafter for up to k_i
tokens; one forward verifies the padded [B, max(w_i)] block (w_i = k_i + 1: the request's last token, then its
draft); each row is accepted by its own rule (``specbench.core.rules``; greedy: ``specbench.core.verify``) and
rolled back on its own: mlx-lm's ``BatchKVCache`` keeps per-row left padding, so the rejected tail of row r becomes
left padding (``prepare(right_padding=...)`` then ``finalize()``); a hybrid model's recurrent layers take each row's
recorded state (``specbench.core.batch_hybrid``). Requests finish on their own stops and lengths (each request is a
``Generation`` of the single-request engine, whose prefill, stop rules and step log it reuses); a waiting request
takes a finished request's slot (continuous batching).

Every batched forward (verify blocks and plain steps) runs through the batch's verifier: fast mode, one forward
over the block; exact mode (the options' ``verify="exact"``; ``specbench.exact.batch_verifier``), the same forward
with every row (request b, position i) computed as request b's own single-request step computes it, so each
request's greedy tokens equal its own plain greedy decoding whatever else is in the batch and whenever it joined.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from specbench.core.batch_hybrid import RowRollback, batch_layer, check_batchable, recurrent_layers
from specbench.core.batch_request import BatchRequest, RowPlan
from specbench.core.draft import Drafter
from specbench.core.options import GenerateOptions, checked_options
from specbench.core.policies import DraftPolicy, as_policy
from specbench.core.policy_args import whole
from specbench.core.target import ModelTarget, generation_context
from specbench.core.types import BatchDrafters, BatchOptions, BatchPolicies, PolicySpec, Prompt, Tokenizer
from specbench.core.verify import FAST, Verifier, VerifyMode, accept_greedy, greedy


@dataclass
class BatchStepRecord:
    """What one batched step did: the requests in the batch (``requests``, in row order), each
    row's verify width, the block's draft / verify / bookkeeping seconds, tokens emitted and draft
    tokens accepted over all rows, and (when counting experts) the distinct experts each MoE layer
    touched across the whole [B, W] block, padding included."""

    step: int
    kind: str
    batch_size: int
    requests: list[int]
    widths: list[int]
    draft_s: float
    verify_s: float
    other_s: float = 0.0
    emitted: int = 0
    accepted: int = 0
    experts: list[int] = field(default_factory=list)

    @property
    def width(self) -> int:
        return max(self.widths)


def requested_verify_mode(options: BatchOptions, n: int) -> VerifyMode | None:
    """The verify mode the ``n`` requests' options ask for (None: none sets one); one clear ValueError, before any
    model work, when they ask for different ones (a batch verifies all its rows one way)."""
    asked: dict[str, list[int]] = {}
    for i, opts in enumerate(_per_request(options, n, "options")):
        if opts is not None and checked_options(opts).verify is not None:
            asked.setdefault(opts.verify, []).append(i)
    if len(asked) > 1:
        which = "; ".join(f"{mode} for requests {', '.join(map(str, rows))}" for mode, rows in sorted(asked.items()))
        raise ValueError(f"the requests ask for different verify modes ({which}): give every request the same verify")
    return cast(VerifyMode, next(iter(asked))) if asked else None


def _per_request(value: Any, n: int, name: str) -> list[Any]:
    """One value per request: a list of n, or one value (or a factory i -> value) for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} entries for {n} prompts: give one per prompt")
        return list(value)
    if callable(value) and not isinstance(value, (Drafter, GenerateOptions, DraftPolicy, type)):
        return [value(i) for i in range(n)]
    return [value] * n


class BatchGeneration:
    """Requests decoded together: ``run()`` (all outputs) or iterate for (request index, tokens)
    per step. ``requests[i]`` is request i (tokens, ``finish_reason()``, ``stats()``, ``log``);
    ``batch_log`` holds one ``BatchStepRecord`` per step.

    ``drafters``: None (plain batched decoding), one drafter per prompt, or a factory i -> drafter.
    ``policy``: one policy (copied per request) or one per prompt. ``max_batch``: at most this many
    requests decode together; the rest wait and join as slots free (default: all at once).
    ``add`` queues a further request while running. ``verifier``: how every batched forward runs, fast
    (``FAST``) or exact (``specbench.exact.batch_verifier``), the verify mode of every request.
    """

    def __init__(
        self,
        model: nn.Module,
        prompts: Sequence[Prompt],
        options: BatchOptions = None,
        drafters: BatchDrafters = None,
        policy: BatchPolicies = None,
        *,
        tokenizer: Tokenizer | None = None,
        verifier: Verifier = FAST,
        break_even: Callable[[int], float] | None = None,
        max_batch: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an mlx-lm model (nn.Module), got {type(model).__name__}")
        if isinstance(prompts, (str, bytes, mx.array)) or not isinstance(prompts, Sequence):
            raise TypeError("prompts must be a list of prompts (each text or token ids)")
        if not prompts:
            raise ValueError("no prompts: give at least one")
        if not isinstance(verifier, Verifier):
            raise TypeError(f"verifier must be a Verifier (FAST, or specbench.exact.batch_verifier), got {verifier!r}")
        requested_verify_mode(options, len(prompts))
        if max_batch is not None:
            whole("max_batch", max_batch, 1)
        check_batchable(model)
        if verifier.mode == "exact" and recurrent_layers(make_prompt_cache(model)):
            raise ValueError(
                "exact batched verification covers attention-only models (KV caches); this model has recurrent "
                "layers: verify its batch in fast mode, or decode its requests one at a time (speculative_generate)"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.verifier = verifier
        self.break_even = break_even
        self.clock = clock
        self.max_batch = max_batch or len(prompts)
        self.requests: list[BatchRequest] = []
        self.waiting: list[BatchRequest] = []
        self.active: list[BatchRequest] = []
        self.batch_log: list[BatchStepRecord] = []
        self.cache: list[Any] | None = None
        self.rollback: RowRollback | None = None
        #: One plain step of every active row queued past the last plain step, not read yet (its tokens, lazy).
        self._queued: mx.array | None = None
        self._wall_s = 0.0
        n = len(prompts)
        if drafters is not None and callable(getattr(drafters, "draft", None)) and n > 1:
            raise ValueError("a drafter follows one request: give one drafter per prompt, or a factory i -> drafter")
        for prompt, opts, drafter, pol in zip(
            prompts,
            _per_request(options, n, "options"),
            _per_request(drafters, n, "drafters"),
            _per_request(policy, n, "policy"),
        ):
            self.add(prompt, opts, drafter, pol)
        self._iter = self._run()

    def add(
        self,
        prompt: Prompt,
        options: GenerateOptions | None = None,
        drafter: Drafter | None = None,
        policy: PolicySpec | None = None,
    ) -> int:
        """Queue a request (checked now); it joins the batch when a slot is free. Its index."""
        options = checked_options(copy.copy(options) if options is not None else None)
        if options.verify not in (None, self.verifier.mode):
            raise ValueError(
                f"request {len(self.requests)} asks for {options.verify} verification, but this batch verifies in "
                f"{self.verifier.mode} mode: give every request the same verify (speculative_generate_batch picks "
                "the batch's verifier from it)"
            )
        if drafter is not None and policy is not None:
            policy = copy.deepcopy(as_policy(policy))
        request = BatchRequest(
            len(self.requests),
            self.model,
            prompt,
            options,
            drafter=drafter,
            policy=policy,
            verifier=self.verifier,
            break_even=self.break_even,
            tokenizer=self.tokenizer,
            clock=self.clock,
        )
        if drafter is not None and policy is None:
            request.policy = copy.deepcopy(request.policy)
        self.requests.append(request)
        self.waiting.append(request)
        return request.index

    def set_break_even(self, break_even: Callable[[int], float]) -> None:
        """The break-even (k -> tokens) handed to each request's policy when it starts."""
        self.break_even = break_even
        for request in self.requests:
            request.break_even = break_even

    # -- public -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[tuple[int, list[int]]]:
        return self._iter

    def run(self) -> list[list[int]]:
        """Decode every request to its end; each request's tokens, in the order given."""
        for _ in self._iter:
            pass
        return [r.tokens for r in self.requests]

    def stats(self) -> dict[str, Any]:
        """Totals over the batch: tokens, steps, wall seconds, tokens/s, mean batch size."""
        tokens = sum(len(r.tokens) for r in self.requests)
        steps = len(self.batch_log)
        return {
            "requests": len(self.requests),
            "tokens": tokens,
            "batch_steps": steps,
            "mean_batch_size": sum(s.batch_size for s in self.batch_log) / steps if steps else 0.0,
            "wall_s": self._wall_s,
            "tokens_per_s": tokens / self._wall_s if self._wall_s > 0 else 0.0,
            "verify": self.verifier.mode,
            "kernel_fallbacks": dict(getattr(self.verifier, "fallbacks", {})),
        }

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> Iterator[tuple[int, list[int]]]:
        start = self.clock()
        counting = any(r.options.count_experts for r in self.requests)
        try:
            with generation_context(self.model, self.verifier, True, counting) as counter:
                self.counter = counter
                while self.waiting or self.active:
                    if self._slot_taken_next() or self._pipelined():
                        yield from self._settle_queued({})  # a row joining or a plain batch: nothing queued ahead
                    yield from self._fill()
                    if self.active:
                        yield from self._plain_stretch() if self._pipelined() else self._step()
        finally:
            self._wall_s = self.clock() - start

    def _fill(self) -> Iterator[tuple[int, list[int]]]:
        """Prefill waiting requests into free slots (each alone, as a single request's prefill)."""
        while self._slot_taken_next():
            request = self.waiting.pop(0)
            request.begin(self.counter)
            yield request.index, list(request.tokens)
            if request.finished:
                continue
            row = [batch_layer(c) for c in request.target.cache]
            request.target.cache = None  # the batch cache holds this request's state from now on
            if self.cache is None:
                self.cache = row
                self.rollback = RowRollback(self.model, self.cache)
            else:
                for layer, row_layer in zip(self.cache, row):
                    layer.extend(row_layer)
            self.active.append(request)

    def _slot_taken_next(self) -> bool:
        """Whether a waiting request takes a free slot before the next step."""
        return bool(self.waiting) and len(self.active) < self.max_batch

    def _step(self) -> Iterator[tuple[int, list[int]]]:
        t0 = self.clock()
        decisions = {r.index: r.decide(len(self.active)) for r in self.active}
        yield from self._settle_queued(decisions)
        active = self.active
        if not active:
            return
        plans = [r.plan(decisions[r.index]) for r in active]
        t1 = self.clock()
        steps = self._plain_steps_planned(plans)
        if steps:  # no row drafts: plain steps pipelined as plain batches are, the next one queued past them
            more = not self._slot_taken_next()  # unless a waiting request joins next
            yield from self._plain_stretch(steps, {r.index: plan for r, plan in zip(active, plans)}, t1 - t0, more)
            return
        rows = [[r.tokens[-1]] + (p.draft.tokens if p.draft is not None else []) for r, p in zip(active, plans)]
        width = max(len(row) for row in rows)
        inputs = mx.array([row + [0] * (width - len(row)) for row in rows], dtype=mx.uint32)
        needs_hidden = any(r.needs_hidden for r in active)
        self.rollback.arm(width)
        out = self.verifier.forward(self.model, inputs, cast(list, self.cache), needs_hidden)
        logits, hidden = out if needs_hidden else (out, None)
        experts = self.counter.take() if self.counter is not None else []
        outcomes = self._accept(logits, rows, plans)
        t2 = self.clock()
        self.rollback.rewind([1 + accepted for _, accepted, _ in outcomes])
        record = BatchStepRecord(
            len(self.batch_log),
            "verify" if width > 1 else "plain",
            len(active),
            [r.index for r in active],
            [len(row) for row in rows],
            draft_s=t1 - t0,
            verify_s=t2 - t1,
        )
        extra = {"batch_step": record.step, "batch_size": len(active)}
        for i, (request, plan, (tokens, accepted, probs)) in enumerate(zip(active, plans, outcomes)):
            row_hidden = hidden[i : i + 1] if hidden is not None and request.needs_hidden else None
            emitted = request.settle(tokens, accepted, probs, row_hidden, plan, t2 - t1, extra)
            record.emitted += len(emitted)
            record.accepted += min(accepted, len(emitted))
            yield request.index, emitted
        record.experts = experts
        record.other_s = self.clock() - t2
        self.batch_log.append(record)
        self._drop_finished()

    def _plain_steps_planned(self, plans: list[RowPlan]) -> int:
        """How many plain steps every active row takes from now when no ``plan`` drafts and the batch can
        pipeline them (greedy rows, no hidden states or expert counts): the fewest the paused rows' policies
        ask for (``Plain.n``), 1 when a row asked for a draft that did not come; 0 when a row drafts. Rows
        without a drafter take as many as the others."""
        if not self._pipelinable():
            return 0
        steps = 1 << 30
        for request, plan in zip(self.active, plans):
            if plan.draft is not None:
                return 0
            if plan.paused:
                steps = min(steps, request.decision.n)
            elif plan.k > 0:
                steps = 1
        return steps

    def _pipelinable(self) -> bool:
        """Whether the batch's plain steps can be pipelined: greedy rows, no hidden states, no expert counts."""
        return self.counter is None and all(r.options.temperature == 0 and not r.needs_hidden for r in self.active)

    def _pipelined(self) -> bool:
        """Whether the next steps are plain greedy steps of every row (no drafter, and ``_pipelinable``),
        which ``_plain_stretch`` pipelines."""
        return self._pipelinable() and all(r.drafter is None for r in self.active)

    def _queue_plain(self, last: mx.array, ahead: int) -> mx.array:
        """Queue one plain greedy step of every active row after ``last`` ([B, 1]); its tokens, lazy. ``ahead``:
        steps queued before it whose tokens are not read yet (each row's EOS mask goes by position)."""
        logits = cast(mx.array, self.verifier.forward(self.model, last, cast(list, self.cache), False))[:, -1]
        active = self.active
        if any(r.options.min_tokens > len(r.tokens) + ahead for r in active):
            logits = mx.concatenate(
                [r.target._mask_eos(logits[i : i + 1], len(r.tokens) + ahead) for i, r in enumerate(active)]
            )
        tokens = greedy(logits)
        mx.async_eval(tokens)
        return tokens

    def _plain_stretch(
        self, steps: int = 1 << 30, plans: dict[int, RowPlan] | None = None, plan_s: float = 0.0, more: bool = False
    ) -> Iterator[tuple[int, list[int]]]:
        """Up to ``steps`` plain greedy steps of every row, pipelined as mlx-lm pipelines them: the next step
        is queued before this one's tokens are read. ``plans``: each row's plan (by request index) that
        asked for these steps, logged on each (paused rows stay paused), with the ``plan_s`` seconds of
        planning on the first step. ``more``: steps follow, so one more is queued past the last and read by
        the next step (``_settle_queued``). When a request finishes, its row is dropped, the step already
        queued for the others is read, and the stretch ends (a waiting request may then take the slot)."""
        plans = plans or {}
        tick = self.clock()
        pending = self._queue_plain(mx.array([[r.tokens[-1]] for r in self.active], dtype=mx.uint32), 0)
        for step in range(1, steps + 1):
            current = pending
            # nothing after the stretch's last step (unless ``more``) or a row's last token
            queued = (step < steps or more) and not any(r._remaining() <= 1 for r in self.active)
            if queued:
                pending = self._queue_plain(current[:, None], 1)
            yield from self._settle_plain(current.tolist(), tick, plans, plan_s if step == 1 else 0.0)
            tick = self.clock()
            finished = [i for i, r in enumerate(self.active) if r.finished]
            self._drop_finished()
            if not queued or not self.active:
                return
            if finished:
                keep = [i for i in range(pending.shape[0]) if i not in finished]
                yield from self._settle_plain(pending[mx.array(keep)].tolist(), tick, plans)
                self._drop_finished()
                return
            if step == steps:
                self._queued = pending
                return

    def _settle_queued(self, plans: dict[int, RowPlan]) -> Iterator[tuple[int, list[int]]]:
        """Read the plain step queued past the last stretch, if any: one token per row, logged with the
        row's ``plans`` entry (its next decision: k requested, paused) as a plain step."""
        if self._queued is None:
            return
        queued, self._queued = self._queued, None
        yield from self._settle_plain(queued.tolist(), self.clock(), plans)
        self._drop_finished()

    def _settle_plain(
        self, tokens: list[int], tick: float, plans: dict[int, RowPlan], plan_s: float = 0.0
    ) -> Iterator[tuple[int, list[int]]]:
        """Emit one plain step's ``tokens`` (one per active row, each logged with its plan) and log it."""
        now = self.clock()
        active = self.active
        rows = [r.index for r in active]
        record = BatchStepRecord(len(self.batch_log), "plain", len(active), rows, [1] * len(rows), plan_s, now - tick)
        extra = {"batch_step": record.step, "batch_size": len(active)}
        for request, token in zip(active, tokens):
            emitted = request.settle([token], 0, [], None, plans.get(request.index, RowPlan()), now - tick, extra)
            record.emitted += len(emitted)
            yield request.index, emitted
        record.other_s = self.clock() - now
        self.batch_log.append(record)

    def _accept(
        self, logits: mx.array, rows: list[list[int]], plans: list[RowPlan]
    ) -> list[tuple[list[int], int, list]]:
        """Each row's (tokens, accepted drafts, acceptance probabilities), by its request's rule."""
        active = self.active
        greedy_rows = {i for i, r in enumerate(active) if r.options.temperature == 0}
        choices: dict[int, list[int]] = {}
        if greedy_rows:
            # One argmax over the block; rows still below min_tokens get theirs with EOS masked.
            masked = {}
            for i in greedy_rows:
                part = logits[i, : len(rows[i])]
                row = active[i].target._mask_eos(part, len(active[i].tokens))
                if row is not part:
                    masked[i] = greedy(row)
            block = greedy(logits)
            mx.eval(block, *masked.values())
            block = block.tolist()
            choices = {i: masked[i].tolist() if i in masked else block[i] for i in greedy_rows}
        outcomes = []
        for i, (request, row, plan) in enumerate(zip(active, rows, plans)):
            draft = row[1:]
            if i in greedy_rows:
                accepted, tokens = accept_greedy(draft, choices[i][: len(row)])
                outcomes.append((tokens, accepted, []))
                continue
            request.sample_seed()
            position = len(request.tokens)
            target = cast(ModelTarget, request.target)  # a batched request's own model target (``BatchRequest``)
            if not draft:
                token = target._pick(logits[i : i + 1, :1], position)
                outcomes.append(([int(token.item())], 0, []))
                continue
            p = request.options.sampling.probs(target._mask_eos(logits[i, : len(row)], position))
            draws = target.draws(p, range(position, position + len(row)))
            accepted, tokens, probs = request.options.rule.path(p, draft, plan.draft.probs, draws)
            outcomes.append((tokens, accepted, probs))
        return outcomes

    def _drop_finished(self) -> None:
        keep = [i for i, r in enumerate(self.active) if not r.finished]
        if len(keep) == len(self.active):
            return
        self.active = [self.active[i] for i in keep]
        if not keep:
            self.cache = self.rollback = None
            return
        for layer in self.cache:
            layer.filter(mx.array(keep))


def generate_batch(
    model: nn.Module,
    prompts: Sequence[Prompt],
    options: BatchOptions = None,
    *,
    tokenizer: Tokenizer | None = None,
    max_batch: int | None = None,
    verifier: Verifier = FAST,
) -> BatchGeneration:
    """Plain batched decoding with the same options, logs and stats as batched speculative decoding; every
    batched step through ``verifier`` (``specbench.generate_batch`` picks it from the options' verify mode)."""
    return BatchGeneration(model, prompts, options, tokenizer=tokenizer, max_batch=max_batch, verifier=verifier)


__all__ = [
    "BatchGeneration",
    "BatchRequest",
    "BatchStepRecord",
    "check_batchable",
    "generate_batch",
    "requested_verify_mode",
]
