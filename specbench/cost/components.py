"""Verify cost by component: where the time of a width-w speculative step goes.

A speculative step of width w (one token and w - 1 drafts) is timed whole through the engine, its drafts
rejected (random tokens), and split into parts, each timed on its own:

- the forward's components, from one forward of the same width over the same cache in which every module
  call of the model waits for its inputs and for its outputs (``mx.eval``), so that each module's own time is
  known: ``attention`` (the attention modules' own work: rotary embedding, cache update, scaled dot-product
  attention), ``linear`` (dense projections: every ``Linear`` outside the experts and the output head),
  ``experts`` (MoE expert gathers ``SwitchGLU`` / ``SwitchMLP`` and the MoE block's own routing work: top-k,
  softmax, combining; its router projection is a ``Linear``), ``recurrent``
  (Gated DeltaNet layers' own work: convolution and the recurrence), ``lm_head`` (the output projection,
  tied or not), ``other`` (embedding, norms, residual additions, masks) and ``readback`` (the greedy
  targets computed and read back to the host);
- the engine's own work, timed inside the real steps: ``drafting``, ``rollback`` (the caches' rewind,
  recording recurrent state), ``logging`` (the step record), ``host`` (the loop's remaining Python around
  the verification: settling, the policy, emitting), and ``acceptance`` (the greedy rule, timed alone on
  lists of the step's length).

The parts' sum is set against the whole step's seconds: ``error`` = sum / whole - 1 says how far the
parts, each timed apart, are from the step as the engine runs it (a synchronised forward cannot overlap
graph building with computation; on a CPU that costs little, on a GPU more).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import generation_stream, wired_limit
from mlx_lm.models.switch_layers import SwitchGLU, SwitchMLP

from specbench.common.identity import device_name, display_name
from specbench.core.engine import Generation, generate
from specbench.core.forward import text_model, vocab_size
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.core.swap import mixed_class
from specbench.core.verify import FAST, accept_greedy, greedy
from specbench.cost.caches import CacheRestore, prefill, rollback_for
from specbench.cost.timing import RandomDrafter, seconds_per_token, time_verify

#: The forward's components, in the order a stack draws them.
FORWARD_PARTS = ("attention", "linear", "experts", "recurrent", "lm_head", "other", "readback")
#: The engine's own per-step work.
ENGINE_PARTS = ("drafting", "acceptance", "rollback", "logging", "host")
PARTS = FORWARD_PARTS + ENGINE_PARTS


def component_of(module: nn.Module) -> tuple[str, bool] | None:
    """(component, leaf) for a module whose calls are timed: ``leaf`` modules are timed whole (their
    children are not instrumented); None for a container whose own time counts as ``other``."""
    name = type(module).__name__
    if isinstance(module, (SwitchGLU, SwitchMLP)):
        return "experts", True
    if "Linear" in name and "Switch" not in name:
        return "linear", True
    if hasattr(module, "A_log") and hasattr(module, "conv1d"):
        return "recurrent", False
    if name.endswith("Attention"):
        return "attention", False
    if name.endswith(("MoeBlock", "MoE")):  # the sparse MoE block (not a decoder layer or model named Moe)
        return "experts", False
    return None


class _Clock:
    """Exclusive seconds per component: each timed call's time less its timed children's."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(FORWARD_PARTS, 0.0)
        self._children: list[float] = []

    @contextlib.contextmanager
    def part(self, component: str, inputs: Sequence[Any]) -> Iterator[list[Any]]:
        """Time the body as ``component``: its array inputs are evaluated first (charged to the caller), its
        outputs (appended to the yielded list) before the clock stops."""
        mx.eval([x for x in inputs if isinstance(x, mx.array)])
        self._children.append(0.0)
        outputs: list[Any] = []
        start = time.perf_counter()
        try:
            yield outputs
            mx.eval(outputs)
        finally:
            inclusive = time.perf_counter() - start
            children = self._children.pop()
            self.seconds[component] += inclusive - children
            if self._children:
                self._children[-1] += inclusive


class _TimedCall:
    """Mixed in front of a component module's class while instrumented: its calls timed as its component."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        state = self.__dict__
        with state["_specbench_clock"].part(state["_specbench_component"], [*args, *kwargs.values()]) as outputs:
            out = super().__call__(*args, **kwargs)
            outputs.append(out)
        return out


@contextlib.contextmanager
def instrumented(model: nn.Module) -> Iterator[_Clock]:
    """While inside, every component module of ``model`` (``component_of``), its output head and the model
    itself run synchronised and timed on the yielded clock; classes and methods are put back after."""
    clock = _Clock()
    lm = text_model(model)
    head = getattr(lm, "lm_head", None)
    swapped: list[tuple[nn.Module, type]] = []
    skip: set[int] = set()

    def swap(module: nn.Module, component: str) -> None:
        # in front of the class it has now (a recurrent layer may be recording already), given back after
        swapped.append((module, type(module)))
        module.__dict__.update(_specbench_clock=clock, _specbench_component=component)
        module.__class__ = mixed_class(_TimedCall, type(module))

    if head is not None:
        swap(head, "lm_head")
        skip.add(id(head))
    for _, module in lm.named_modules():
        if id(module) in skip:
            continue
        found = component_of(module)
        if found is not None:
            swap(module, found[0])
            if found[1]:
                skip.update(id(m) for _, m in module.named_modules())
    embed = lm.model.embed_tokens
    tied = head is None and hasattr(embed, "as_linear")
    if tied:
        as_linear = embed.as_linear

        def timed_as_linear(x: mx.array) -> mx.array:
            with clock.part("lm_head", [x]) as outputs:
                outputs.append(out := as_linear(x))
            return out

        embed.__dict__["as_linear"] = timed_as_linear
    swap(model, "other")
    try:
        yield clock
    finally:
        for module, cls in reversed(swapped):
            module.__class__ = cls
            module.__dict__.pop("_specbench_clock", None)
            module.__dict__.pop("_specbench_component", None)
        if tied:
            embed.__dict__.pop("as_linear", None)


def forward_components(model: nn.Module, cache: list[Any], tokens: mx.array, restore: CacheRestore) -> dict[str, float]:
    """Seconds per forward component of one verification forward of ``tokens`` ([1, w]) over ``cache``,
    every module synchronised (``instrumented``), the greedy targets read back; the cache restored."""
    rollback = rollback_for(model, cache)
    if rollback is not None:  # a hybrid model's verify records its recurrent states: armed before timing, kept timed
        rollback.before_verify(tokens.shape[1])
    with instrumented(model) as clock:
        logits = model(tokens, cache=cache)
        start = time.perf_counter()
        greedy(logits[0]).tolist()
        clock.seconds["readback"] = time.perf_counter() - start
    if rollback is not None:
        rollback.rewind(0)
    restore()
    return clock.seconds


def _wrap(owner: Any, name: str, totals: dict[str, float], part: str) -> None:
    """Time every call of ``owner.name`` (an instance attribute from now on) into ``totals[part]``."""
    inner = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[part] += time.perf_counter() - start

    setattr(owner, name, timed)


def engine_steps(model: nn.Module, cache: list[Any], first: int, width: int, steps: int) -> list[dict[str, float]]:
    """Per speculative step of ``width`` (drafts rejected): its seconds (``step``), the seconds inside the
    target's verification (``verify``) and the engine parts timed inside it. The cache is left extended."""
    # steps + width tokens: ``steps`` verifications at full width, then narrower ones near the end (left out)
    options = GenerateOptions(max_tokens=steps + width, ignore_eos=True, verify="fast")
    gen = Generation(
        model,
        [first],
        options,
        drafter=RandomDrafter(vocab_size(model)),
        policy=DraftPolicy.fixed(width - 1),
        prompt_cache=cache,
    )
    totals = dict.fromkeys(("verify", "rollback", "logging"), 0.0)
    _wrap(gen.target, "verify", totals, "verify")
    rollback = gen.target.inner.rollback  # the model target's, inside the pipeline
    _wrap(rollback, "before_verify", totals, "rollback")
    _wrap(rollback, "rewind", totals, "rollback")
    _wrap(gen.log, "append", totals, "logging")
    rows, last = [], None
    for _ in gen:
        now = time.perf_counter()
        record = gen.log.records[-1]
        if last is not None and record.kind == "verify" and record.verify_width == width:
            rows.append({"step": now - last, "drafting": record.draft_s, **totals})
        totals.update(dict.fromkeys(totals, 0.0))
        last = now
    return rows


def _acceptance_seconds(width: int, vocab: int, repeats: int = 200) -> float:
    """Seconds of the greedy acceptance rule on a draft of ``width - 1`` tokens, timed alone."""
    rng = np.random.default_rng(0)
    draft, targets = rng.integers(0, vocab, width - 1).tolist(), rng.integers(0, vocab, width).tolist()
    start = time.perf_counter()
    for _ in range(repeats):
        accept_greedy(draft, targets)
    return (time.perf_counter() - start) / repeats


def _round(
    model: nn.Module,
    cache: list[Any],
    restore: CacheRestore,
    rollback: Any,
    tokens: mx.array,
    first: int,
    steps: int,
) -> dict[str, float]:
    """One timing round at width w = tokens.shape[1]: the forward's components, then the whole (the fastest
    engine step of ``steps``, the first left out; at width 1 a serial forward) and the engine parts in it."""
    parts = dict.fromkeys(PARTS, 0.0) | forward_components(model, cache, tokens, restore)
    width = tokens.shape[1]
    if width == 1:
        return parts | {"whole": time_verify(FAST, model, cache, tokens, restore, rollback)}
    timed = engine_steps(model, cache, first, width, steps)[1:]
    restore()
    fastest = min(timed, key=lambda s: s["step"])
    for part in ("drafting", "rollback", "logging"):
        parts[part] = fastest[part]
    parts["host"] = fastest["step"] - fastest["drafting"] - fastest["verify"] - fastest["logging"]
    return parts | {"whole": fastest["step"]}


def measure_components(
    model: nn.Module,
    widths: Sequence[int] = (1, 2, 5),
    offset: int = 256,
    repeats: int = 3,
    steps: int = 6,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """The component stack of a speculative step at each width (fast verification): one row per (width,
    part) with its ``seconds`` (the forward's parts from the fastest of ``repeats`` synchronised forwards, the
    engine's from the fastest engine step), ``c`` (in plain steps), the whole step's ``step_s`` and ``c_step``
    (the fastest step), and ``error`` (sum of parts / whole - 1).
    Width 1 (no draft: no engine step) holds the forward's components against a serial width-1 forward,
    as the profile's c(1) is timed. ``c`` is in plain steps (pipelined, as the profile's plain step). The
    cache holds ``offset`` random tokens."""
    if not widths or min(widths) < 1 or repeats < 1 or steps < 2 or offset < 1:
        raise ValueError("widths must be >= 1, repeats >= 1, steps >= 2 and offset >= 1")
    rng = np.random.default_rng(seed)
    vocab = vocab_size(model)
    rows: list[dict[str, Any]] = []
    with wired_limit(model, [generation_stream]), mx.stream(generation_stream):
        cache = prefill(model, rng.integers(0, vocab, size=offset).tolist())
        restore = CacheRestore(cache)
        first = int(rng.integers(0, vocab))
        plain_options = GenerateOptions(max_tokens=steps + 1, ignore_eos=True)
        plain = statistics.median(
            [seconds_per_token(generate(model, [first], plain_options, prompt_cache=cache)) for _ in range(2)]
        )
        restore()
        rollback = rollback_for(model, cache)
        for w in sorted(set(widths)):
            tokens = mx.array(rng.integers(0, vocab, size=w).tolist(), dtype=mx.uint32)[None]
            rounds = [_round(model, cache, restore, rollback, tokens, first, steps) for _ in range(1 + repeats)][1:]
            # the fastest round of each, as timeit takes the fastest repeat: on a busy machine contention only
            # adds time, and a synchronised forward pays it at every module boundary
            fastest_forward = min(rounds, key=lambda r: sum(r[p] for p in FORWARD_PARTS))
            fastest_step = min(rounds, key=lambda r: r["whole"])
            parts = {p: (fastest_forward if p in FORWARD_PARTS else fastest_step)[p] for p in PARTS}
            parts["acceptance"] = _acceptance_seconds(w, vocab) if w > 1 else 0.0
            whole = fastest_step["whole"]
            error = sum(parts.values()) / whole - 1.0
            total = sum(parts.values())
            if progress is not None:
                progress(f"width {w}: parts {1e3 * total:.1f} ms, measured {1e3 * whole:.1f} ms")
            for part in PARTS:
                rows.append(
                    {
                        "name": display_name(model),
                        "device": device_name(),
                        "offset": offset,
                        "width": w,
                        "part": part,
                        "group": "forward" if part in FORWARD_PARTS else "engine",
                        "seconds": parts[part],
                        "c": parts[part] / plain,
                        "step_s": whole,
                        "c_step": whole / plain,
                        "plain_step_s": plain,
                        "error": error,
                    }
                )
    return rows


def deciding_part(rows: Sequence[dict[str, Any]]) -> tuple[str, float]:
    """The part whose seconds grow most from the narrowest to the widest width measured, and its share of
    that growth: what decides how fast c(w) rises (a verification's extra cost)."""
    widths = sorted({r["width"] for r in rows})
    if len(widths) < 2:
        raise ValueError("the deciding part needs stacks at two widths at least")
    at = {(r["width"], r["part"]): r["seconds"] for r in rows}
    growth = {p: at.get((widths[-1], p), 0.0) - at.get((widths[0], p), 0.0) for p in PARTS}
    total = sum(max(g, 0.0) for g in growth.values())
    part = max(growth, key=growth.__getitem__)
    return part, growth[part] / total if total > 0 else 0.0
