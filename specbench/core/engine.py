"""The decode loop: plain and speculative generation, stops and finish reasons.

Data flows one way: prompt -> drafter.draft -> one verify forward -> accept rule -> cache rollback ->
drafter.observe -> step log -> emitted tokens. The loop runs against a target (``specbench.core.target``): a model,
or a recorded output when simulating. The policy decides each step (``specbench.core.auto`` for the default), and
one verification's mechanics (the draft checked, the forward, the accept rule, the rollback) are in
``specbench.core.verify``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from numbers import Integral
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specbench.common.text import check_text
from specbench.core import reasons
from specbench.core.draft import Draft, Drafter
from specbench.core.log import StepLog, StepRecord
from specbench.core.options import GenerateOptions, checked_options
from specbench.core.policies import DraftPolicy, Plain, Speculate
from specbench.core.target import ModelTarget, Pipeline, Step, Target
from specbench.core.tree import depths
from specbench.core.verify import FAST, Verifier, as_draft, check_draft, cut_unconfident


def token_ids(prompt: Any, tokenizer: Any = None) -> list[int]:
    """Token ids of a prompt given as text (with a tokenizer), an mx.array or a sequence of ids."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("the prompt is text but no tokenizer was given: pass token ids or tokenizer=")
        return list(tokenizer.encode(check_text(prompt)))
    if isinstance(prompt, mx.array):
        if not mx.issubdtype(prompt.dtype, mx.integer):
            raise TypeError(f"the prompt is an mx.array of {prompt.dtype}: token ids must be integers")
        return [int(t) for t in prompt.reshape(-1).tolist()]
    if isinstance(prompt, bytes) or not isinstance(prompt, Iterable):
        raise TypeError(f"the prompt must be text, an mx.array or a list of token ids, got {type(prompt).__name__}")
    ids = list(prompt)
    for t in ids:
        if not isinstance(t, Integral) or isinstance(t, bool):
            raise TypeError(f"prompt token ids must be integers, got {t!r} ({type(t).__name__})")
    return [int(t) for t in ids]


class Generation:
    """One generation: iterate it for token ids; then ``stats()``, ``finish_reason()``, ``log``.

    ``source`` is an mlx-lm model (or a ``Target``, such as a recorded output). ``verifier``
    computes verifications (fast unless given); ``break_even`` (k -> tokens a verification of k
    drafts must yield) is handed to the policy when it starts. ``clock`` times the log's columns.
    """

    def __init__(
        self,
        source: nn.Module | Target,
        prompt_ids: Any,
        options: GenerateOptions | None = None,
        *,
        drafter: Drafter | None = None,
        policy: DraftPolicy | None = None,
        verifier: Verifier = FAST,
        break_even: Callable[[int], float] | None = None,
        tokenizer: Any = None,
        prompt_cache: list[Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.options = options = checked_options(options)
        self.prompt = token_ids(prompt_ids, tokenizer)
        if not self.prompt:
            raise ValueError("the prompt is empty: give at least one token")
        if options.stop_strings and tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: pass tokenizer=")
        eos = set(options.eos_token_ids) | set(getattr(tokenizer, "eos_token_ids", None) or [])
        if drafter is not None and not callable(getattr(drafter, "draft", None)):
            raise TypeError(f"drafter must be a Drafter (e.g. PromptLookup()), got {drafter!r}")
        if policy is not None and not isinstance(policy, DraftPolicy):
            raise TypeError(
                f"policy must be a DraftPolicy (DraftPolicy.fixed(4), .adaptive(8), .auto(); text through "
                f"DraftPolicy.parse), got {policy!r}"
            )
        if getattr(drafter, "tree", False) is True and options.temperature > 0:
            options.rule.check_tree()
        if options.sample_by_position and options.temperature > 0 and getattr(drafter, "sampled_drafts", False):
            options.rule.check_by_position(True, f"drafter {getattr(drafter, 'name', 'drafter')}")
        self.drafter = drafter
        self.policy = (policy or DraftPolicy.auto()) if drafter is not None else None
        self.needs_hidden = bool(drafter is not None and drafter.needs_hidden)
        if isinstance(source, nn.Module):
            source = ModelTarget(
                source, options, verifier, prompt_cache, sorted(eos), self.needs_hidden, speculative=drafter is not None
            )
        self.model = getattr(source, "model", None)
        self._check_prompt(source)
        self.cached_prompt_tokens = source.cached_tokens(len(self.prompt)) if isinstance(source, ModelTarget) else 0
        limit = source.context_limit
        self.target = Pipeline(
            source, options.max_tokens if limit is None else min(options.max_tokens, limit - len(self.prompt))
        )
        if self.cached_prompt_tokens and self.needs_hidden:
            raise ValueError(
                f"drafter {drafter.name} needs the hidden states of the whole prompt: pass a fresh prompt cache"
            )
        self.tokenizer = tokenizer
        self.stop_ids = set(options.stop_token_ids) | (set() if options.ignore_eos else eos)
        self.detokenizer = tokenizer.detokenizer if options.stop_strings else None
        self.break_even = break_even
        self.clock = clock
        self.log = StepLog()
        self.tokens: list[int] = []
        self._finish: str | None = None
        self._wall_s = 0.0
        self._observe_s = 0.0
        self._iter = self._run()

    def _check_prompt(self, target: Target) -> None:
        vocab, limit = target.vocab, target.context_limit
        bad = [t for t in self.prompt if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            allowed = f"[0, {vocab})" if vocab is not None else ">= 0"
            raise ValueError(f"prompt token ids {bad[:5]} are outside the model's vocabulary {allowed}")
        for name in ("stop_token_ids", "eos_token_ids"):
            outside = [t for t in getattr(self.options, name) if vocab is not None and t >= vocab]
            if outside:
                raise ValueError(f"{name} {outside[:5]} are outside the model's vocabulary [0, {vocab})")
        if limit is not None and len(self.prompt) >= limit:
            raise ValueError(
                f"the prompt has {len(self.prompt)} tokens but the model's context is {limit}: shorten the prompt"
            )

    # -- public -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        return next(self._iter)

    def finish_reason(self) -> str | None:
        """ "stop" (EOS, stop token or stop string), "length" (max_tokens), "context" (model's
        context full), or None while generation is still running."""
        return self._finish

    def stats(self) -> dict[str, Any]:
        """The log's totals, the prompt, the finish reason, the wall seconds, ``observe_s`` (seconds the drafter
        spent taking in emitted tokens: host work plain decoding does not do) and, where exact verification was
        audited (or ran serially past its calibration), ``exact_audit``: its ``AuditResult``."""
        verifier = getattr(getattr(self.target, "inner", self.target), "verifier", None)  # a batch's: its target
        audit = verifier.audit_result() if verifier is not None else None
        return {
            **self.log.stats(),
            "prompt_tokens": len(self.prompt),
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "finish_reason": self._finish,
            "wall_s": self._wall_s,
            "observe_s": self._observe_s,
            **({"exact_audit": audit} if audit is not None else {}),
        }

    @property
    def cache(self) -> list[Any] | None:
        """The model's prompt cache (None when decoding against a recorded output)."""
        return getattr(self.target.inner, "cache", None)

    def text(self) -> str:
        if self.tokenizer is None:
            raise ValueError("no tokenizer was given")
        return self.tokenizer.decode(self.tokens)

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> Iterator[int]:
        drafter, policy = self.drafter, self.policy
        start = self.clock()
        if self.options.seed is not None:
            mx.random.seed(self.options.seed)
        if drafter is not None:
            policy.start(drafter, self.break_even)
        self._longest = policy.longest_draft(drafter) if drafter is not None else 0  # a shorter draft says why
        try:
            with self.target.running():
                yield from self._prefill()
                while self._finish is None:
                    if drafter is None:
                        yield from self._plain_stretch(self._remaining(), reason=reasons.NO_DRAFTER)
                        continue
                    decision = policy.decide(self.log, drafter)
                    if isinstance(decision, Plain):
                        n = min(decision.n, self._remaining())
                        why = decision.reason or f"{reasons.POLICY}: {policy.name} decoded plainly"
                        shadow = decision.shadow if n > 1 else 0
                        yield from self._plain_stretch(n, paused=True, shadow=shadow, reason=why)
                    else:
                        yield from self._speculate(decision)
        finally:
            self._wall_s = self.clock() - start
            if drafter is not None:
                drafter.end()

    def _prefill(self) -> Iterator[int]:
        t0 = self.clock()
        step, prompt_hidden = self.target.prefill(self.prompt, self.cached_prompt_tokens)
        if self.drafter is not None:
            self.drafter.begin(list(self.prompt), prompt_hidden)
        emitted = self._stop_at(step.tokens)
        self._record("prefill", 0, emitted, verify_width=len(self.prompt), verify_s=self.clock() - t0, extra=step.extra)
        yield from self._emit(emitted, step.hidden)

    def _plain_stretch(
        self,
        n: int,
        paused: bool = False,
        k_requested: int = 0,
        draft_s: float = 0.0,
        shadow: int = 0,
        reason: str = "",
    ) -> Iterator[int]:
        """``n`` plain steps (the target pipelines them); ``shadow``: tokens drafted first and not
        verified, logged on the first step for the policy to compare with the tokens decoded; ``reason``: why
        plain (``specbench.core.reasons``), on every step of the stretch."""
        position = len(self.tokens)
        shadow_tokens: list[int] = []
        if shadow > 0:
            t0 = self.clock()
            draft = self._draft(shadow)
            parents = draft.parents or []  # a tree: its leading path
            shadow_tokens = list(draft.tokens)[: next((i for i, p in enumerate(parents) if p != i - 1), shadow)]
            draft_s = self.clock() - t0
        tick = self.clock()  # before the first step is queued: on a CPU queuing computes it
        for i, step in enumerate(self.target.plain_steps(position, n)):
            now = self.clock()
            emitted = self._stop_at(step.tokens)
            self._record(
                "plain",
                position + i,
                emitted,
                k_requested=k_requested,
                draft_s=draft_s if i == 0 else 0.0,
                verify_s=now - tick,
                paused=paused,
                reason=reason,
                draft_tokens=shadow_tokens if i == 0 else [],
                extra=step.extra,
            )
            tick = now
            yield from self._emit(emitted, step.hidden)
            if self._finish is not None:
                return

    def _speculate(self, decision: Speculate) -> Iterator[int]:
        """A speculative decision: the plain step the target queued ahead (logged as a plain step on the way,
        not a paused one), then a speculative step (a plain one where a single token remains)."""
        t0 = self.clock()
        step = self.target.ready()
        if step is not None:
            emitted = self._stop_at(step.tokens)
            verify_s = self.clock() - t0
            why = f"{reasons.PIPELINED}: the plain step queued ahead of the draft"
            self._record(
                "plain",
                len(self.tokens),
                emitted,
                k_requested=decision.k,
                verify_s=verify_s,
                reason=why,
                extra=step.extra,
            )
            yield from self._emit(emitted, step.hidden)
        if self._finish is not None:
            return
        if self._remaining() <= 1:
            yield from self._plain_stretch(1, k_requested=decision.k, reason=reasons.LAST_TOKEN)
        else:
            k = min(decision.k, self._remaining() - 1)
            why = decision.reason
            if k < decision.k:
                why = f"{reasons.TOKENS_LEFT}: {self._remaining()} tokens left, k = {k} of {decision.k}"
            elif not why and decision.k < self._longest:
                why = f"{reasons.POLICY}: {self.policy.name} asked k = {k} of its longest {self._longest}"
            yield from self._speculative_step(k, decision.probing, decision.min_confidence, why)

    def _speculative_step(self, k: int, probing: bool, min_confidence: float = 0.0, reason: str = "") -> Iterator[int]:
        """Draft (cut where the drafter's confidence falls under ``min_confidence``), verify (forward,
        accept, rollback), stop, record, emit; ``reason``: why fewer than the policy's longest."""
        t0 = self.clock()
        proposed = self._draft(k)
        draft = cut_unconfident(proposed, min_confidence)
        t1 = self.clock()
        if len(draft.tokens) < len(proposed.tokens):
            reason = f"{reasons.CONFIDENCE_CUT}: {len(draft.tokens)} of {len(proposed.tokens)} kept"
        elif len(draft.tokens) < k:
            reason = f"{reasons.DRAFTER_SHORT}: {len(draft.tokens)} of {k} drafted"
        if not draft.tokens:  # a plain step instead (2+ tokens remain here), the one after it queued
            yield from self._plain_stretch(1, k_requested=k, draft_s=t1 - t0, reason=reason)
            return
        draft = self._checked(draft)  # timed with the verification, as the target's own checks are
        step = self.target.verify(draft, len(self.tokens), probing)
        t2 = self.clock()
        emitted = self._stop_at(step.tokens)
        self._record_verify(k, draft, step, emitted, draft_s=t1 - t0, verify_s=t2 - t1, since=t2, reason=reason)
        yield from self._emit(emitted, step.hidden[:, : len(emitted)] if step.hidden is not None else None)

    def _draft(self, k: int) -> Draft:
        """The drafter's draft of up to ``k`` tokens after the tokens so far."""
        return as_draft(self.drafter.draft(self.prompt + self.tokens, k), k, self._drafter_name())

    def _checked(self, draft: Draft) -> Draft:
        """``draft`` checked (``check_draft``); sampling by position, drafts sampled from q (``Draft.probs``) only
        where the rule can give plain sampling's tokens with them (before the verification's forward)."""
        sampling = self.options.temperature > 0
        checked = check_draft(draft, self._drafter_name(), self.target.vocab, sampling=sampling)
        if sampling and self.options.sample_by_position and checked.probs is not None:
            self.options.rule.check_by_position(True, f"drafter {self._drafter_name()}")
        return checked

    def _record_verify(
        self,
        k: int,
        draft: Draft,
        step: Step,
        emitted: list[int],
        *,
        draft_s: float,
        verify_s: float,
        since: float | None = None,
        reason: str = "",
    ) -> None:
        """Log the verification of ``draft`` (asked for ``k`` tokens) that gave ``step``; accepted tokens past a
        stop are never emitted, so never counted; ``since``: when the step's bookkeeping began."""
        accepted = min(step.accepted, len(emitted))
        tree = draft.parents is not None  # a checked path has none
        self._record(
            "verify",
            len(self.tokens),
            emitted,
            k_requested=k,
            k_drafted=len(draft.tokens),
            accepted=accepted,
            verify_width=len(draft.tokens) + 1,
            draft_s=draft_s,
            verify_s=verify_s,
            accept_probs=step.accept_probs,
            draft_tokens=list(draft.tokens),
            draft_parents=list(draft.parents) if tree else [],
            tree_nodes=len(draft.tokens) if tree else 0,
            tree_depth=max(depths(draft.parents)) if tree else 0,
            accepted_path=step.path[:accepted] if tree else [],
            extra=step.extra,
            other_since=since,
            reason=reason,
        )

    def _record(
        self, kind: str, position: int, emitted: list[int], other_since: float | None = None, **fields: Any
    ) -> None:
        """Append the log record of one step (``other_since``: when the step's bookkeeping began)."""
        if other_since is not None:
            fields["other_s"] = self.clock() - other_since
        accepted = fields.get("accepted", 0)
        self.log.append(
            StepRecord(
                step=len(self.log),
                position=position,
                kind=kind,
                drafter=self._drafter_name(),
                policy=getattr(self.policy, "name", "none"),
                emitted=len(emitted),
                accepted_positions=list(range(accepted)),
                tokens=emitted,
                **fields,
            )
        )

    def _remaining(self) -> int:
        left = self.options.max_tokens - len(self.tokens)
        limit = self.target.context_limit
        if limit is not None:
            left = min(left, limit - len(self.prompt) - len(self.tokens))
        return left

    def _stop_at(self, tokens: list[int]) -> list[int]:
        """Cut ``tokens`` at the first stop (token, string, length or a recorded stop) and set the
        finish reason."""
        room = max(self._remaining(), 0)
        stop_index = self.target.stop_index
        for i, t in enumerate(tokens[:room]):
            if (
                t in self.stop_ids
                or len(self.tokens) + i == stop_index
                or (self.detokenizer is not None and self._stop_string_hit(t))
            ):
                self._finish = "stop"
                return tokens[: i + 1]
        if len(tokens) >= room:
            self._finish = "length" if self.options.max_tokens - len(self.tokens) <= room else "context"
        return tokens[:room]

    def _stop_string_hit(self, token: int) -> bool:
        detok = self.detokenizer
        before = len(detok.text)
        detok.add_token(token)
        longest = max(len(s) for s in self.options.stop_strings)
        tail = detok.text[max(0, before - longest + 1) :]
        return any(s in tail for s in self.options.stop_strings)

    def _emit(self, tokens: list[int], hidden: mx.array | None) -> Iterator[int]:
        if self.drafter is not None and tokens:
            t0 = self.clock()
            self.drafter.observe(tokens, hidden)
            self._observe_s += self.clock() - t0
        for t in tokens:
            self.tokens.append(t)
            yield t

    def _drafter_name(self) -> str:
        return getattr(self.drafter, "name", "none")


def plain_generation(
    model: nn.Module,
    prompt: Any,
    options: GenerateOptions | None = None,
    *,
    tokenizer: Any = None,
    prompt_cache: list[Any] | None = None,
    verifier: Verifier = FAST,
) -> Generation:
    """Plain decoding of ``prompt`` (text or token ids) with the same options, log and stats as speculative
    decoding. ``verifier``: the verify mode's, whose ``decoding()`` says how plain steps run (the exact verifier's
    one-row kernels, ``specbench.decoding.generate``); by default the model's own calls."""
    return Generation(model, prompt, options, tokenizer=tokenizer, prompt_cache=prompt_cache, verifier=verifier)


__all__ = ["Generation", "Step", "plain_generation", "token_ids"]
