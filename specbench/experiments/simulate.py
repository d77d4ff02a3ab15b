"""Offline acceptance simulator: what a model-free drafter would do, without running the model.

Under greedy verification the accepted tokens of every step are fixed by the draft and the model's
own greedy output, so a recorded plain run (prompt and output ids per request) is enough to replay
speculative decoding with any model-free drafter, draft length and policy. ``simulate`` runs the
engine's decode loop (``specbench.engine.Generation``) step for step, with the recorded output in
place of the model, and returns the ``StepLog`` the real run would write, timing columns excepted
(they are 0). Policies are the real policy objects; ``DraftPolicy.auto()`` needs the model's cost
profile (``cost=``) or a fixed ``break_even``.

One boundary: when a draft runs past the recorded output's stop token, the model's predictions after
the stop are unknown; the simulator counts accepted tokens up to the stop (the tokens that can be
emitted).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from specbench.common.files import write_parquet_atomic
from specbench.drafters.base import Drafter, as_draft
from specbench.core.engine import GenerateOptions
from specbench.core.log import StepLog, StepRecord
from specbench.core.policies import DraftPolicy

FINISH_REASONS = ("stop", "length", "context")


@dataclass
class Recorded:
    """One request's plain greedy run: prompt ids, emitted ids (a stop token included), and why it ended."""

    prompt: list[int]
    output: list[int]
    finish_reason: str
    id: str = ""

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError(f"recorded request {self.id!r} has an empty prompt")
        if not self.output:
            raise ValueError(f"recorded request {self.id!r} has no output tokens")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"recorded request {self.id!r}: finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}"
            )

    @classmethod
    def from_generation(cls, generation: Any, id: str = "") -> "Recorded":
        """From a finished ``Generation`` (plain or speculative with greedy exact verification)."""
        if generation.finish_reason() is None:
            raise ValueError("the generation has not finished: iterate it to the end first")
        return cls(list(generation.prompt), list(generation.tokens), generation.finish_reason(), id)


def record(model: Any, prompts: Iterable[Any], options: GenerateOptions, tokenizer: Any = None) -> list[Recorded]:
    """Run plain greedy decoding on each prompt and keep what the simulator needs."""
    from specbench.core.engine import generate

    if options.temperature != 0:
        raise ValueError("the simulator replays greedy decoding: record with temperature=0")
    out = []
    for i, prompt in enumerate(prompts):
        gen = generate(model, prompt, options, tokenizer=tokenizer)
        for _ in gen:
            pass
        out.append(Recorded.from_generation(gen, str(i)))
    return out


def from_trace(trace: Any, tokenizer: Any, turns: int | None = None) -> list[Recorded]:
    """A trace's recorded replies as if a model had written them (no model run): each turn's prompt
    rendered from the recorded history, its output the reply's text (tool calls written out as
    ``as_text_messages`` writes them) and an EOS. For studying drafters on the trace's own text;
    acceptance against a real model needs ``record`` or the trace benchmark's plain outputs."""
    from specbench.experiments.traces import as_text_messages, render_turn

    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [])
    out = []
    for t, turn in enumerate(trace.turns[: len(trace.turns) if turns is None else turns]):
        if turn.assistant is None:
            raise ValueError(f"trace {trace.id!r}: turn {t} has no recorded reply")
        text = as_text_messages([turn.assistant])[0]["content"]
        output = list(tokenizer.encode(text, add_special_tokens=False)) + eos[:1]
        out.append(Recorded(render_turn(tokenizer, trace, t), output, "stop" if eos else "length", f"{trace.id}/{t}"))
    return out


def save_recorded(requests: Sequence[Recorded], path: str | os.PathLike) -> Path:
    """Write recorded requests as parquet (columns id, prompt, output, finish_reason), atomically."""
    import polars as pl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    frame = pl.DataFrame(
        {
            "id": [r.id for r in requests],
            "prompt": [r.prompt for r in requests],
            "output": [r.output for r in requests],
            "finish_reason": [r.finish_reason for r in requests],
        },
        schema={"id": pl.Utf8, "prompt": pl.List(pl.Int64), "output": pl.List(pl.Int64), "finish_reason": pl.Utf8},
    )
    return write_parquet_atomic(frame, path)


def load_recorded(path: str | os.PathLike) -> list[Recorded]:
    """Recorded requests from ``save_recorded``'s parquet (or any table with its columns)."""
    import polars as pl

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no recorded outputs at {path}")
    frame = pl.read_parquet(path)
    missing = {"prompt", "output", "finish_reason"} - set(frame.columns)
    if missing:
        raise ValueError(f"{path}: recorded outputs need columns prompt, output, finish_reason; missing {sorted(missing)}")
    ids = frame["id"].to_list() if "id" in frame.columns else [str(i) for i in range(len(frame))]
    return [
        Recorded(list(p), list(o), f, str(i))
        for i, p, o, f in zip(ids, frame["prompt"].to_list(), frame["output"].to_list(), frame["finish_reason"].to_list())
    ]


def _as_recorded(item: Recorded | Mapping[str, Any], index: int) -> Recorded:
    if isinstance(item, Recorded):
        return item
    if isinstance(item, Mapping):
        try:
            return Recorded(list(item["prompt"]), list(item["output"]), item["finish_reason"], str(item.get("id", index)))
        except KeyError as err:
            raise ValueError(f"recorded request {index} needs 'prompt', 'output' and 'finish_reason'; missing {err}") from None
    raise ValueError(f"recorded request {index} must be a Recorded or a mapping, got {type(item).__name__}")


class _Replay:
    """The engine's decode loop over a recorded output (mirrors ``engine.Generation._run``)."""

    def __init__(self, request: Recorded, options: GenerateOptions, drafter: Drafter, policy: DraftPolicy,
                 context_limit: int | None):
        self.request = request
        self.options = options
        self.drafter = drafter
        self.policy = policy
        self.context_limit = context_limit
        self.prompt = list(request.prompt)
        self.output = request.output
        self.tokens: list[int] = []
        self.finish: str | None = None
        self.log = StepLog()
        known = len(self.output) if request.finish_reason != "stop" else None
        if known is not None and options.max_tokens > known and (
            context_limit is None or len(self.prompt) + known < context_limit
        ):
            raise ValueError(
                f"recorded request {request.id!r} ended by {request.finish_reason!r} after {known} tokens; "
                f"simulate with max_tokens <= {known} (got {options.max_tokens})"
            )

    def run(self, cost: Any) -> StepLog:
        drafter, policy = self.drafter, self.policy
        policy.start(cost, drafter, verify=self.options.verify_mode)
        try:
            drafter.begin(list(self.prompt))
            emitted = self._stop_at([self.output[0]])
            self._append(0, "prefill", 0, 0, 0, emitted, len(self.prompt), False, [])
            self._emit(emitted)
            while self.finish is None:
                k = policy.next_k(self.log, drafter)
                if k <= 0:
                    self._plain(min(policy.plain_run(), self._remaining()), paused=True)
                elif self._remaining() > 1:
                    self._speculative(min(k, self._remaining() - 1))
                else:
                    self._plain(1, paused=False, k_requested=k)
        finally:
            drafter.end()
        return self.log

    def _remaining(self) -> int:
        left = self.options.max_tokens - len(self.tokens)
        if self.context_limit is not None:
            left = min(left, self.context_limit - len(self.prompt) - len(self.tokens))
        return left

    def _stop_at(self, tokens: list[int]) -> list[int]:
        room = self._remaining()
        last = len(self.output) - 1
        for i, _ in enumerate(tokens):
            if i >= room:
                self.finish = "length" if self.options.max_tokens - len(self.tokens) <= i else "context"
                return tokens[:i]
            if self.request.finish_reason == "stop" and len(self.tokens) + i == last:
                self.finish = "stop"
                return tokens[: i + 1]
        if len(tokens) >= room:
            self.finish = "length" if self.options.max_tokens - len(self.tokens) <= len(tokens) else "context"
        return tokens

    def _append(self, position, kind, k_requested, k_drafted, accepted, emitted, width, paused, draft_tokens):
        self.log.append(
            StepRecord(
                step=len(self.log), position=position, kind=kind, drafter=getattr(self.drafter, "name", "none"),
                policy=getattr(self.policy, "name", "none"), k_requested=k_requested, k_drafted=k_drafted,
                accepted=accepted, emitted=len(emitted), accepted_positions=list(range(accepted)),
                verify_width=width, draft_s=0.0, verify_s=0.0, other_s=0.0, paused=paused, tokens=emitted,
                draft_tokens=draft_tokens,
            )
        )

    def _emit(self, tokens: list[int]) -> None:
        if tokens:
            self.drafter.observe(tokens, None)
        self.tokens.extend(tokens)

    def _plain(self, n: int, paused: bool, k_requested: int = 0) -> None:
        position = len(self.tokens)
        for i in range(n):
            emitted = self._stop_at([self.output[position + i]])
            self._append(position + i, "plain", k_requested, 0, 0, emitted, 1, paused, [])
            self._emit(emitted)
            if self.finish is not None:
                return

    def _speculative(self, k: int) -> None:
        draft = as_draft(self.drafter.draft(self.prompt + self.tokens, k), k)
        if not draft.tokens:
            self._plain(1, paused=False, k_requested=k)
            return
        position = len(self.tokens)
        targets = self.output[position : position + len(draft.tokens) + 1]
        n = 0
        while n < len(draft.tokens) and n < len(targets) and draft.tokens[n] == targets[n]:
            n += 1
        emitted = self._stop_at(list(draft.tokens[:n]) + targets[n : n + 1])
        self._append(position, "verify", k, len(draft.tokens), n, emitted, len(draft.tokens) + 1, False, list(draft.tokens))
        self._emit(emitted)


def simulate(
    requests: Sequence[Recorded | Mapping[str, Any]],
    drafter: Drafter,
    policy: DraftPolicy | str | None = None,
    options: GenerateOptions | None = None,
    cost: Any = None,
    context_limit: int | None = None,
) -> StepLog:
    """Replay speculative decoding with ``drafter`` over recorded plain greedy outputs.

    ``requests``: ``Recorded`` (or mappings with prompt, output, finish_reason), replayed in order
    with one drafter (so SuffixDecoding's global store carries over). ``policy``: a policy or its
    text form (default ``auto``); ``options``: the decoding options of the real run (max_tokens;
    defaults to each output's length); ``cost``: what ``policy.start`` gets in place of the model
    (a ``cost.Profile`` or the model itself; needed by ``auto`` without a fixed break-even);
    ``context_limit``: the model's context length, when it binds. Returns one log, with a
    ``request`` column (the request's index).
    """
    if drafter is None:
        raise ValueError("simulate needs a drafter (plain decoding needs no simulation)")
    if getattr(drafter, "needs_hidden", False):
        raise ValueError(f"drafter {getattr(drafter, 'name', drafter)!r} needs the model's hidden states: it cannot be simulated")
    if isinstance(policy, str):
        policy = DraftPolicy.parse(policy)
    if policy is None:
        policy = DraftPolicy.auto()
    if cost is None and getattr(policy, "fixed_break_even", 0) is None:
        raise ValueError(
            "DraftPolicy.auto() needs the model's verify cost: pass cost= (a specbench.cost.Profile or the model) "
            "or use DraftPolicy.auto(break_even=...) / fixed:N / adaptive:N"
        )
    log = StepLog()
    for index, item in enumerate(requests):
        request = _as_recorded(item, index)
        opts = options if options is not None else GenerateOptions(max_tokens=len(request.output))
        opts.check()
        if opts.temperature != 0:
            raise ValueError("the simulator replays greedy verification: use temperature=0")
        for r in _Replay(request, opts, drafter, policy, context_limit).run(cost):
            r["request"] = index
            log.append(r)
    return log


def sweep(
    requests: Sequence[Recorded | Mapping[str, Any]],
    drafters: Mapping[str, Callable[[], Drafter]],
    policies: Sequence[DraftPolicy | str],
    options: GenerateOptions | None = None,
    cost: Any = None,
):
    """Simulate every (drafter, policy) pair; one row of ``StepLog.stats()`` each, as a polars DataFrame.

    ``drafters`` maps a label to a factory, so every run starts from a fresh drafter.
    """
    import polars as pl

    rows = []
    for label, make in drafters.items():
        for spec in policies:
            policy = DraftPolicy.parse(spec) if isinstance(spec, str) else spec
            stats = simulate(requests, make(), policy, options, cost).stats()
            rows.append({"drafter": label, "policy": getattr(policy, "name", str(spec)), **stats})
    return pl.DataFrame(rows)
