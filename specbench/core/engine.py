"""The decode loop: plain and speculative generation, stops and finish reasons.

Data flows one way: prompt -> drafter.draft -> one verify forward -> accept rule -> cache
rollback -> drafter.observe -> step log -> emitted tokens.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generation_stream, wired_limit
from mlx_lm.models.cache import make_prompt_cache

from specbench.drafters.base import Drafter, as_draft
from specbench.core.forward import forward, text_model
from specbench.core.log import StepLog, StepRecord
from specbench.core.policies import DraftPolicy
from specbench.core.rollback import CacheRollback
from specbench.core.accept import SamplingSettings, accept_greedy, accept_sampled

VERIFY_MODES = ("exact", "fast")


@dataclass
class GenerateOptions:
    """Options shared by plain and speculative generation (mlx-lm's names where they exist).

    ``verify``: "exact" computes every row of a verification as serial decoding would (the
    default for greedy decoding), "fast" runs one batched forward (the default when sampling).
    ``count_experts``: record the distinct experts each MoE layer touches per step (in the log
    record's ``extra["experts"]``); off by default, and free when off.
    """

    max_tokens: int = 256
    stop_token_ids: Sequence[int] = ()
    stop_strings: Sequence[str] = ()
    eos_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    min_p: float = 0.0
    top_k: int = 0
    seed: int | None = None
    verify: str | None = None
    prefill_step_size: int = 2048
    count_experts: bool = False

    def check(self) -> None:
        """Raise one clear ValueError for the first invalid option."""
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.verify not in (None, *VERIFY_MODES):
            raise ValueError(f"verify must be one of {VERIFY_MODES} (or None), got {self.verify!r}")
        if self.prefill_step_size < 1:
            raise ValueError(f"prefill_step_size must be >= 1, got {self.prefill_step_size}")

    @property
    def sampling(self) -> SamplingSettings:
        return SamplingSettings(self.temperature, self.top_p, self.min_p, self.top_k)

    @property
    def verify_mode(self) -> str:
        if self.verify is not None:
            return self.verify
        return "exact" if self.temperature == 0 else "fast"


def vocab_size(model: nn.Module) -> int:
    lm = text_model(model)
    args = getattr(lm, "args", None)
    if args is not None and getattr(args, "vocab_size", None):
        return int(args.vocab_size)
    return int(lm.model.embed_tokens.weight.shape[0])


def context_length(model: nn.Module) -> int | None:
    args = getattr(text_model(model), "args", None)
    value = getattr(args, "max_position_embeddings", None)
    return int(value) if value else None


def _prompt_ids(prompt: Any, tokenizer: Any) -> list[int]:
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("the prompt is text but no tokenizer was given: pass token ids or tokenizer=")
        return list(tokenizer.encode(prompt))
    if isinstance(prompt, mx.array):
        return [int(t) for t in prompt.reshape(-1).tolist()]
    return [int(t) for t in prompt]


def _greedy(logits: mx.array) -> mx.array:
    """Argmax of log-probabilities, as mlx-lm's greedy sampler computes it."""
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return mx.argmax(logprobs, axis=-1)


class Generation:
    """One generation: iterate it for token ids; then ``stats()``, ``finish_reason()``, ``log``."""

    def __init__(
        self,
        model: nn.Module,
        prompt_ids: Any,
        options: GenerateOptions | None = None,
        drafter: Drafter | None = None,
        policy: DraftPolicy | None = None,
        tokenizer: Any = None,
        prompt_cache: list[Any] | None = None,
    ):
        self.options = options = options or GenerateOptions()
        options.check()
        self.model = model
        self.prompt = _prompt_ids(prompt_ids, tokenizer)
        if not self.prompt:
            raise ValueError("the prompt is empty: give at least one token")
        vocab = vocab_size(model)
        bad = [t for t in self.prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the model's vocabulary [0, {vocab})")
        self.context_limit = context_length(model)
        if self.context_limit is not None and len(self.prompt) >= self.context_limit:
            raise ValueError(
                f"the prompt has {len(self.prompt)} tokens but the model's context is "
                f"{self.context_limit}: shorten the prompt"
            )
        if options.stop_strings and tokenizer is None:
            raise ValueError("stop_strings need a tokenizer: pass tokenizer=")
        self.vocab = vocab
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.policy = policy if policy is not None else (DraftPolicy.auto() if drafter else None)
        self.cache = prompt_cache if prompt_cache is not None else make_prompt_cache(model)
        # A prompt cache may already hold the prompt's first tokens (a conversation's history).
        # A cache holding fewer tokens than the prompt holds its first tokens (a conversation's
        # history): only the rest is prefilled. One holding as many or more is a context the
        # prompt continues.
        held = int(getattr(self.cache[0], "offset", 0) or 0) if prompt_cache is not None else 0
        self.cached_prompt_tokens = held if held < len(self.prompt) else 0
        if self.cached_prompt_tokens and drafter is not None and drafter.needs_hidden:
            raise ValueError(
                f"drafter {drafter.name} needs the hidden states of the whole prompt: pass a fresh prompt cache"
            )
        self.rollback = None
        if drafter is not None:
            from specbench.exact.hooks import layout_sensitive_attention

            # Exact verification where attention reads past its keys: serial decoding has zeros there.
            clear = options.verify_mode == "exact" and layout_sensitive_attention()
            self.rollback = CacheRollback(self.cache, model, clear_rejected=clear)
        eos = set(options.eos_token_ids)
        if tokenizer is not None:
            eos |= set(getattr(tokenizer, "eos_token_ids", None) or [])
        self.eos_ids = sorted(eos)
        self.stop_ids = set(options.stop_token_ids) | (set() if options.ignore_eos else eos)
        self.detokenizer = tokenizer.detokenizer if options.stop_strings else None
        self.log = StepLog()
        self.tokens: list[int] = []
        self._finish: str | None = None
        self._wall_s = 0.0
        self._iter = self._run()

    # -- public -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        return next(self._iter)

    def finish_reason(self) -> str | None:
        """"stop" (EOS, stop token or stop string), "length" (max_tokens), "context" (model's
        context full), or None while generation is still running."""
        return self._finish

    def stats(self) -> dict[str, Any]:
        return {
            **self.log.stats(),
            "prompt_tokens": len(self.prompt),
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "finish_reason": self._finish,
            "wall_s": self._wall_s,
        }

    def text(self) -> str:
        if self.tokenizer is None:
            raise ValueError("no tokenizer was given")
        return self.tokenizer.decode(self.tokens)

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> Iterator[int]:
        options, drafter, policy = self.options, self.drafter, self.policy
        start = time.perf_counter()
        if options.seed is not None:
            mx.random.seed(options.seed)
        self.sampler = options.sampling.sampler()
        self._serial_layout = drafter is not None and options.verify_mode == "exact"
        self.needs_hidden = bool(drafter is not None and drafter.needs_hidden)
        if policy is not None:
            policy.start(self.model, drafter, verify=options.verify_mode)
        self._counter = None
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(wired_limit(self.model, [generation_stream]))
                stack.enter_context(mx.stream(generation_stream))
                if options.count_experts:
                    from specbench.core.experts import ExpertCounter

                    self._counter = stack.enter_context(ExpertCounter(self.model))
                first = self._prefill()
                yield from self._emit_plain(first)
                while self._finish is None:
                    if drafter is None:
                        yield from self._plain_stretch(self._remaining(), paused=False)
                        continue
                    k = policy.next_k(self.log, drafter)
                    if k <= 0:
                        yield from self._plain_stretch(min(policy.plain_run(), self._remaining()), paused=True)
                    elif self._remaining() > 1:
                        yield from self._speculative_step(min(k, self._remaining() - 1))
                    else:
                        yield from self._plain_stretch(1, paused=False, k_requested=k)
        finally:
            self._wall_s = time.perf_counter() - start
            if drafter is not None:
                drafter.end()

    def _remaining(self) -> int:
        left = self.options.max_tokens - len(self.tokens)
        if self.context_limit is not None:
            left = min(left, self.context_limit - len(self.prompt) - len(self.tokens))
        return left

    def _mask_eos(self, logits: mx.array, first_position: int) -> mx.array:
        """Suppress EOS in rows whose output position is below ``min_tokens``."""
        rows = logits.shape[-2]
        masked_rows = min(rows, self.options.min_tokens - first_position)
        if masked_rows <= 0 or not self.eos_ids:
            return logits
        column = mx.zeros((logits.shape[-1],), dtype=mx.bool_)
        column[mx.array(self.eos_ids)] = True
        row = mx.arange(rows)[:, None] < masked_rows
        return mx.where(row & column, mx.array(-float("inf"), logits.dtype), logits)

    def _pick(self, logits: mx.array, position: int) -> mx.array:
        """Sample one token from the last row of ``logits`` [1, w, vocab], as mlx-lm does."""
        logits = self._mask_eos(logits[:, -1, :], position)
        if self.options.temperature == 0:
            return _greedy(logits)[0]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return self.sampler(logprobs)[0]

    def _prefill(self) -> tuple[mx.array, mx.array | None]:
        t0 = time.perf_counter()
        prompt = mx.array(self.prompt, dtype=mx.uint32)
        step = self.options.prefill_step_size
        hidden_parts = []
        done = self.cached_prompt_tokens
        while len(self.prompt) - done > 1:
            n = min(step, len(self.prompt) - done - 1)
            out = forward(self.model, prompt[None, done : done + n], self.cache, self.needs_hidden)
            if self.needs_hidden:
                hidden_parts.append(out[1])
                mx.eval(out[1])
            mx.eval([c.state for c in self.cache])
            done += n
        out = forward(self.model, prompt[None, done:], self.cache, self.needs_hidden)
        logits, hidden = out if self.needs_hidden else (out, None)
        token = self._pick(logits, 0)
        extra = self._experts()
        mx.eval(token)
        if self.drafter is not None:
            prompt_hidden = mx.concatenate(hidden_parts, axis=1) if hidden_parts else None
            self.drafter.begin(list(self.prompt), prompt_hidden)
        self._prefill_s = time.perf_counter() - t0
        return token, hidden, extra

    def _plain_step(self, y: mx.array, position: int) -> tuple[mx.array, mx.array | None, dict]:
        if self._serial_layout:
            # After a rollback the KV buffers keep the verification's length; give them the
            # length serial decoding has, since some kernels choose by it.
            from specbench.exact.hooks import serial_kv_layout

            serial_kv_layout(self.cache, 1)
        out = forward(self.model, y.reshape(1, 1), self.cache, self.needs_hidden)
        logits, hidden = out if self.needs_hidden else (out, None)
        return self._pick(logits, position), hidden, self._experts()

    def _experts(self) -> dict[str, Any]:
        """The log record's extra columns: expert counts of the forward just built, when counting."""
        return {"experts": self._counter.take()} if self._counter is not None else {}

    def _emit_plain(self, step: tuple[mx.array, mx.array | None, dict]) -> Iterator[int]:
        """Emit the prefill's token with its log record."""
        token, hidden, extra = step
        t = int(token.item())
        emitted = self._stop_at([t])
        self.log.append(
            StepRecord(
                step=0, position=0, kind="prefill", drafter=self._drafter_name(), policy=self._policy_name(),
                k_requested=0, k_drafted=0, accepted=0, emitted=len(emitted), accepted_positions=[],
                verify_width=len(self.prompt), draft_s=0.0, verify_s=self._prefill_s, other_s=0.0,
                paused=False, tokens=emitted, extra=extra,
            )
        )
        yield from self._yield_tokens(emitted, hidden)
        self._y = token

    def _plain_stretch(self, n: int, paused: bool, k_requested: int = 0, draft_s: float = 0.0) -> Iterator[int]:
        """``n`` plain steps, pipelined as mlx-lm pipelines them (the next step is queued before
        the current token is read)."""
        position = len(self.tokens)
        tick = time.perf_counter()  # before the first step is queued: on a CPU queuing computes it
        pending = self._plain_step(self._y, position)
        mx.async_eval(pending[0])
        for i in range(n):
            current = pending
            if i + 1 < n:
                pending = self._plain_step(current[0], position + i + 1)
                mx.async_eval(pending[0])
            t = int(current[0].item())
            now = time.perf_counter()
            emitted = self._stop_at([t])
            self.log.append(
                StepRecord(
                    step=len(self.log), position=position + i, kind="plain", drafter=self._drafter_name(),
                    policy=self._policy_name(), k_requested=k_requested, k_drafted=0, accepted=0,
                    emitted=len(emitted), accepted_positions=[], verify_width=1,
                    draft_s=draft_s, verify_s=now - tick, other_s=0.0, paused=paused, tokens=emitted,
                    extra=current[2],
                )
            )
            tick = now
            yield from self._yield_tokens(emitted, current[1])
            self._y = current[0]
            if self._finish is not None:
                return

    def _speculative_step(self, k: int) -> Iterator[int]:
        t0 = time.perf_counter()
        draft = as_draft(self.drafter.draft(self.prompt + self.tokens, k), k)
        t1 = time.perf_counter()
        if not draft.tokens:
            yield from self._plain_stretch(1, paused=False, k_requested=k, draft_s=t1 - t0)
            return
        bad = [t for t in draft.tokens if not 0 <= t < self.vocab]
        if bad:
            raise ValueError(f"drafter {self._drafter_name()} proposed token ids {bad[:5]} outside [0, {self.vocab})")
        y = int(self._y.item()) if isinstance(self._y, mx.array) else int(self._y)
        inputs = mx.array([[y] + draft.tokens], dtype=mx.uint32)
        width = inputs.shape[1]
        position = len(self.tokens)
        self.rollback.before_verify(width)
        with self._verify_context():
            out = forward(self.model, inputs, self.cache, self.needs_hidden)
        logits, hidden = out if self.needs_hidden else (out, None)
        extra = self._experts()
        logits = self._mask_eos(logits[0], position)
        if self.options.temperature == 0:
            # In exact mode each row's choice is made on its own, as a serial step makes it.
            rows = [logits[i : i + 1] for i in range(width)] if self.options.verify_mode == "exact" else [logits]
            targets = mx.concatenate([_greedy(r) for r in rows]).tolist()
            n, emitted = accept_greedy(draft.tokens, targets)
            probs: list[float] = []
        else:
            p = self.options.sampling.probs(logits)
            n, emitted, probs = accept_sampled(p, draft.tokens, draft.probs)
        t2 = time.perf_counter()
        self.rollback.rewind(len(draft.tokens) - n)
        emitted = self._stop_at(emitted)
        n = min(n, len(emitted))  # accepted tokens past a stop are never emitted
        self.log.append(
            StepRecord(
                step=len(self.log), position=position, kind="verify", drafter=self._drafter_name(),
                policy=self._policy_name(), k_requested=k, k_drafted=len(draft.tokens), accepted=n,
                emitted=len(emitted), accepted_positions=list(range(n)), verify_width=width,
                draft_s=t1 - t0, verify_s=t2 - t1, other_s=time.perf_counter() - t2, paused=False,
                accept_probs=probs, tokens=emitted, draft_tokens=list(draft.tokens), extra=extra,
            )
        )
        yield from self._yield_tokens(emitted, hidden[:, : len(emitted)] if hidden is not None else None)
        self._y = mx.array(emitted[-1], dtype=mx.uint32)

    def _verify_context(self):
        if self.options.verify_mode == "exact":
            from specbench.exact.hooks import exact_mode

            return exact_mode(self.model)
        return contextlib.nullcontext()

    def _stop_at(self, tokens: list[int]) -> list[int]:
        """Cut ``tokens`` at the first stop (token, string or length) and set the finish reason."""
        room = self._remaining()
        for i, t in enumerate(tokens):
            if i >= room:
                self._finish = "length" if self.options.max_tokens - len(self.tokens) <= i else "context"
                return tokens[:i]
            if t in self.stop_ids:
                self._finish = "stop"
                return tokens[: i + 1]
            if self.detokenizer is not None and self._stop_string_hit(t):
                self._finish = "stop"
                return tokens[: i + 1]
        if len(tokens) >= room:
            self._finish = "length" if self.options.max_tokens - len(self.tokens) <= len(tokens) else "context"
        return tokens

    def _stop_string_hit(self, token: int) -> bool:
        detok = self.detokenizer
        before = len(detok.text)
        detok.add_token(token)
        longest = max(len(s) for s in self.options.stop_strings)
        tail = detok.text[max(0, before - longest + 1) :]
        return any(s in tail for s in self.options.stop_strings)

    def _yield_tokens(self, tokens: list[int], hidden: mx.array | None) -> Iterator[int]:
        if self.drafter is not None and tokens:
            self.drafter.observe(tokens, hidden)
        for t in tokens:
            self.tokens.append(t)
            yield t

    def _drafter_name(self) -> str:
        return getattr(self.drafter, "name", "none") if self.drafter is not None else "none"

    def _policy_name(self) -> str:
        return getattr(self.policy, "name", "none") if self.policy is not None and self.drafter is not None else "none"


def speculative_generate(
    model: nn.Module,
    prompt_ids: Any,
    options: GenerateOptions | None = None,
    drafter: Drafter | None = None,
    policy: DraftPolicy | None = None,
    tokenizer: Any = None,
    prompt_cache: list[Any] | None = None,
) -> Generation:
    """Speculative decoding: ``drafter`` proposes, one forward pass verifies, ``policy`` (default
    ``DraftPolicy.auto()``) picks draft lengths. Greedy output equals ``generate``'s."""
    return Generation(model, prompt_ids, options, drafter, policy, tokenizer, prompt_cache)


def generate(
    model: nn.Module,
    prompt_ids: Any,
    options: GenerateOptions | None = None,
    tokenizer: Any = None,
    prompt_cache: list[Any] | None = None,
) -> Generation:
    """Plain decoding with the same options, log and stats as ``speculative_generate``."""
    return Generation(model, prompt_ids, options, None, None, tokenizer, prompt_cache)
