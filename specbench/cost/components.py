"""Verify cost by component: where the time of a width-w speculative step goes.

A step of width w (one token and w - 1 drafts, rejected) is timed whole through the engine and split into parts:

- the forward's components, by subtraction: the forward timed as the engine runs it, whole and with one component's
  modules answering from a recorded forward (``record_forward``, then ``forward_with_stand_ins``: the rest of the
  graph computes the same values, the logits equal bit for bit, without the stood-in work); the component costs
  the difference.
  ``attention`` (rotary embedding, cache update, attention), ``linear`` (dense projections outside the experts
  and the head), ``experts`` (MoE gathers and routing), ``recurrent`` (Gated DeltaNet layers), ``lm_head``;
  ``other`` is the skeleton with every component stood in for, ``readback`` the greedy targets read back.
  ``closure`` = (components + skeleton) / whole forward - 1 says how far they are from adding up;
- the engine's own work, timed inside the real steps: ``drafting``, ``rollback``, ``logging``, ``host`` (the
  loop's remaining Python) and ``acceptance`` (the greedy rule, timed alone).

``error`` = sum of the parts / whole step - 1 (medians throughout, as the profile's c(w)). On a GPU a part's
removal also shifts work between host and device, so subtraction under-counts the forward's wait for the device;
``phase_stack`` counts the parts by phase instead, and ``phase_reading`` says how far that is off.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.generate import generation_stream, wired_limit
from mlx_lm.models.switch_layers import SwitchGLU, SwitchMLP

from specbench.common.identity import device_name, display_name
from specbench.core.forward import context_length, prefill, text_model, vocab_size
from specbench.core.swap import mixed_class
from specbench.core.verify import FAST, accept_greedy
from specbench.cost.timing import CacheRestore, rejected_drafts, rollback_for, time_plain, time_verify

#: The forward's components, in the order a stack draws them.
FORWARD_PARTS = ("attention", "linear", "experts", "recurrent", "lm_head", "other", "readback")
#: The engine's own per-step work.
ENGINE_PARTS = ("drafting", "acceptance", "rollback", "logging", "host")
PARTS = FORWARD_PARTS + ENGINE_PARTS
#: Where a forward's seconds go: the Python building the graph, its dispatch to the device (the host's phases),
#: the wait after.
HOST_PHASES = ("build", "dispatch")
PHASES = (*HOST_PHASES, "wait")


def component_of(module: nn.Module) -> tuple[str, bool] | None:
    """(component, leaf) for a module whose calls are stood in for: a ``leaf`` module is stood in for whole (its
    children are not sites of their own); None for a container whose own time counts as ``other``."""
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


@dataclass(eq=False)
class RecordedCall:
    """One recorded call of a component module: its inputs, its output and the component calls made inside it."""

    site: ComponentSite
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any = None
    inner: list[RecordedCall] = field(default_factory=list)


@dataclass(eq=False)
class ComponentSite:
    """A component module (or a tied output head, ``owner.as_linear``) whose calls are recorded and stood in for."""

    component: str
    module: nn.Module | None
    owner: nn.Module | None = None  # the embedding of a tied output head
    calls: list[RecordedCall] = field(default_factory=list)

    def invoke(self, *args: Any, **kwargs: Any) -> Any:
        """Call the module (or the tied head) as the model would."""
        if self.module is not None:
            return self.module(*args, **kwargs)
        return self.owner.as_linear(*args, **kwargs)  # type: ignore[union-attr]


class _Recorder:
    """Records the component calls of one forward as a tree (a call made inside another is its ``inner``)."""

    def __init__(self) -> None:
        self.stack: list[RecordedCall] = []

    def call(
        self, site: ComponentSite, inner: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        record = RecordedCall(site, args, kwargs)
        if self.stack:
            self.stack[-1].inner.append(record)
        site.calls.append(record)
        self.stack.append(record)
        try:
            record.output = inner(*args, **kwargs)
        finally:
            self.stack.pop()
        return record.output


class _StandIns:
    """Answers the calls of the stood-in components with their recorded outputs, in call order. Kept in ``side``
    (evaluated with the logits): each stood-in call's inputs (so the work upstream of it still runs), and the
    outputs of the component calls recorded inside it that belong to components still running, made again on
    their recorded inputs (so their work stays in the forward while the stood-in component's own work leaves).
    Stood-in calls recorded inside a stood-in one are answered too, as they are when only they stand in, so that
    every variant pays the same stand-in calls. ``bookkeeping_s``: the seconds spent answering (the calls made
    again left out), the measurement's own work."""

    def __init__(self, components: Collection[str]) -> None:
        self.components = frozenset(components)
        self.side: list[Any] = []
        self.answered: dict[int, int] = {}
        self.bookkeeping_s = 0.0
        self.stack: list[str] = []  # what runs now: "answering", or "calling" (a call made from an answer)
        self.mark = 0.0

    def _switch(self, push: str | None) -> None:
        """Charge the seconds since the last switch to answering if that is what ran, then enter ``push`` (or
        leave what runs now)."""
        now = time.perf_counter()
        if self.stack and self.stack[-1] == "answering":
            self.bookkeeping_s += now - self.mark
        if push is None:
            self.stack.pop()
        else:
            self.stack.append(push)
        self.mark = now

    def call(
        self, site: ComponentSite, inner: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Answer a call of a stood-in component (``inner``, its own call, is not made)."""
        self._switch("answering")
        try:
            # the call's own inputs are evaluated with the logits: the recorded output cuts the graph, and without
            # them lazy evaluation would skip everything upstream of the stood-in call
            self.side += [x for x in (*args, *kwargs.values()) if isinstance(x, mx.array)]
            index = self.answered.get(id(site), 0)
            self.answered[id(site)] = index + 1
            record = site.calls[index]
            self._keep(record.inner)
            return record.output
        finally:
            self._switch(None)

    def _keep(self, calls: list[RecordedCall]) -> None:
        for call in calls:
            # made again, or (stood in too) answered from the record with its call's own cost left in the forward,
            # as when the call's caller runs and only it stands in
            self._switch("calling")
            try:
                self.side.append(call.site.invoke(*call.args, **call.kwargs))
            finally:
                self._switch(None)


class _Handled:
    """Mixed in front of a component module's class: its calls go to its handler (recorded or stood in for)."""

    _specbench_handler: _Recorder | _StandIns
    _specbench_site: ComponentSite

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._specbench_handler.call(self._specbench_site, super().__call__, args, kwargs)


def component_sites(model: nn.Module) -> list[ComponentSite]:
    """The component modules of ``model`` (``component_of``; the output head, tied or not, as ``lm_head``);
    the children of a leaf component are not sites of their own."""
    lm = text_model(model)
    head = getattr(lm, "lm_head", None)
    sites: list[ComponentSite] = []
    skip: set[int] = set()
    if head is not None:
        sites.append(ComponentSite("lm_head", head))
        skip.add(id(head))
    else:
        embed = lm.model.embed_tokens
        if hasattr(embed, "as_linear"):
            sites.append(ComponentSite("lm_head", None, owner=embed))
    for _, module in lm.named_modules():
        if id(module) in skip:
            continue
        found = component_of(module)
        if found is not None:
            sites.append(ComponentSite(found[0], module))
            if found[1]:
                skip.update(id(m) for _, m in module.named_modules())
    return sites


@contextlib.contextmanager
def _mixed_in(sites: Sequence[ComponentSite], handler: _Recorder | _StandIns) -> Iterator[None]:
    """While inside, each site's module has ``_Handled`` in front of the class it has now (a recurrent layer may be
    recording already) and ``handler`` and its site in its ``__dict__``; a tied head's ``as_linear`` goes to
    ``handler`` alike. Classes and methods are put back after."""
    swapped: list[tuple[nn.Module, type]] = []
    wrapped: list[nn.Module] = []
    try:
        for site in sites:
            if site.module is None:
                wrapped.append(owner := site.owner)  # type: ignore[arg-type]
                as_linear = owner.as_linear  # type: ignore[union-attr]
                owner.__dict__["as_linear"] = lambda *a, s=site, f=as_linear, **k: handler.call(s, f, a, k)
                continue
            module = site.module
            swapped.append((module, type(module)))
            module.__dict__.update(_specbench_handler=handler, _specbench_site=site)
            module.__class__ = mixed_class(_Handled, type(module))
        yield
    finally:
        for module, cls in reversed(swapped):
            module.__class__ = cls
            for name in ("_specbench_handler", "_specbench_site"):
                module.__dict__.pop(name, None)
        for owner in wrapped:
            owner.__dict__.pop("as_linear", None)


def _arrays(calls: list[RecordedCall]) -> list[Any]:
    """Every array a recorded call tree took or gave (to be evaluated once, before any timing)."""
    out: list[Any] = []
    for call in calls:
        out += [x for x in (*call.args, *call.kwargs.values(), call.output) if isinstance(x, mx.array)]
        out += _arrays(call.inner)
    return out


def record_forward(
    model: nn.Module, cache: list[Any], tokens: mx.array, restore: CacheRestore, rollback: Any = None
) -> tuple[list[ComponentSite], mx.array]:
    """The component sites of ``model`` with the calls of one verification forward of ``tokens`` recorded
    (inputs and outputs evaluated), and its logits; the cache restored."""
    sites = component_sites(model)
    if rollback is not None:
        rollback.before_verify(tokens.shape[1])
    with _mixed_in(sites, _Recorder()):
        logits = FAST.forward(model, tokens, cache)
    mx.eval(logits, _arrays([c for s in sites for c in s.calls]))
    if rollback is not None:
        rollback.rewind(0)
    restore()
    return sites, logits


def _cache_state(cache: list[Any]) -> list[mx.array]:
    """The arrays a forward leaves in ``cache`` (key-value slices, recurrent and convolution states)."""
    return [a for _, a in tree_flatten([entry.state for entry in cache]) if isinstance(a, mx.array)]


def _collections() -> int:
    """Garbage collections run so far, every generation."""
    return sum(generation["collections"] for generation in gc.get_stats())


@dataclass(frozen=True)
class ForwardTiming:
    """Where a timed forward's seconds went: ``build`` (the Python forward building the graph), ``dispatch``
    (handing its work to the device: until ``mx.async_eval`` returns), ``wait`` (the rest: waiting for the
    device); the garbage ``collections`` that ran meanwhile and the stood-in calls ``answered`` from the record
    (those nested in another stood-in call included)."""

    build: float
    dispatch: float
    wait: float
    collections: float
    answered: float

    @property
    def seconds(self) -> float:
        """The forward's seconds, the stand-ins' own bookkeeping left out."""
        return self.build + self.dispatch + self.wait


def forward_with_stand_ins(
    model: nn.Module,
    cache: list[Any],
    tokens: mx.array,
    restore: CacheRestore,
    sites: Sequence[ComponentSite],
    components: Collection[str] = (),
    rollback: Any = None,
) -> tuple[ForwardTiming, mx.array]:
    """The timing of one verification forward of ``tokens`` over ``cache``, unsynchronised inside (as the engine
    runs it), with the modules of ``components`` stood in for by their recorded outputs (``record_forward``);
    and its logits. A stood-in attention writes nothing to the cache and a stood-in recurrent layer keeps its
    state: no later layer reads another's cache within a forward, and the cache is restored after.
    The stand-ins' own bookkeeping (answering from the record) is left out of the seconds."""
    if rollback is not None:  # a hybrid model's verify records its recurrent states: armed as the engine arms it
        rollback.before_verify(tokens.shape[1])
    stand_ins = _StandIns(components)
    stood = [s for s in sites if s.component in stand_ins.components]
    with _mixed_in(stood, stand_ins):
        mx.synchronize()
        collected = _collections()
        start = time.perf_counter()
        logits = FAST.forward(model, tokens, cache)
        built = time.perf_counter()
        outputs = (logits, stand_ins.side, _cache_state(cache))  # the cache's new state too, as the next step needs it
        mx.async_eval(*outputs)
        dispatched = time.perf_counter()
        mx.eval(*outputs)
        end = time.perf_counter()
        # the stand-ins' own bookkeeping is the measurement's, not the forward's: a stood-in projection's answer
        # costs about what building the projection does, and the skeleton never answers those nested in a
        # stood-in attention, so left in, it would count against every component and not against the skeleton
        build = built - start - stand_ins.bookkeeping_s
    answered = float(sum(stand_ins.answered.values()))
    timing = ForwardTiming(build, dispatched - built, end - dispatched, float(_collections() - collected), answered)
    if rollback is not None:
        rollback.rewind(0)
    restore()
    return timing, logits


@dataclass(frozen=True)
class ForwardSplit:
    """A verification forward split by subtraction: ``parts`` (``FORWARD_PARTS``, seconds), the whole forward's
    seconds (unsynchronised, readback apart) and its ``closure``; per phase (``PHASES``) the whole forward's
    seconds, the closure within it, and each component's subtraction (the skeleton's seconds as ``other``);
    ``collections``: garbage collections per whole forward (mean)."""

    parts: dict[str, float]
    forward_s: float
    closure: float
    phases: dict[str, float] = field(default_factory=dict)
    phase_closure: dict[str, float] = field(default_factory=dict)
    collections: float = 0.0
    part_phases: dict[str, dict[str, float]] = field(default_factory=dict)


def forward_components(
    model: nn.Module,
    cache: list[Any],
    tokens: mx.array,
    restore: CacheRestore,
    repeats: int = 15,
    between: Callable[[int], None] | None = None,
) -> ForwardSplit:
    """The forward's components at width w = tokens.shape[1], by subtraction (see the module), medians over
    ``repeats`` with the variants' order reversed every other repeat; a negative subtraction counts 0.
    ``between(r)``, if given, runs after round r (0: the warm-up) and must leave the cache as it found it."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    rollback = rollback_for(model, cache)
    sites, _ = record_forward(model, cache, tokens, restore, rollback)
    present = [c for c in FORWARD_PARTS if any(s.component == c for s in sites)]
    variants = {"forward": (), **{c: (c,) for c in present}, "skeleton": tuple(present)}
    timings: dict[str, list[ForwardTiming]] = {name: [] for name in variants}
    readback: list[float] = []
    for r in range(1 + repeats):  # the first round warms every variant up and is left out
        for name in list(variants) if r % 2 else list(variants)[::-1]:
            timing, logits = forward_with_stand_ins(model, cache, tokens, restore, sites, variants[name], rollback)
            if r == 0:
                continue
            timings[name].append(timing)
            if name == "forward":
                start = time.perf_counter()
                FAST.greedy(logits[0])
                readback.append(time.perf_counter() - start)
        if between is not None:
            between(r)
    whole, skeleton = timings.pop("forward"), timings.pop("skeleton")

    def median(runs: list[ForwardTiming], phase: str | None) -> float:
        return statistics.median(t.seconds if phase is None else getattr(t, phase) for t in runs)

    def saving(component: str, phase: str | None = None) -> float:
        """The median over rounds of the whole forward's seconds less the variant's (paired within a round)."""
        return statistics.median(
            f.seconds - t.seconds if phase is None else getattr(f, phase) - getattr(t, phase)
            for f, t in zip(whole, timings[component])
        )

    forward_s, read_s = median(whole, None), statistics.median(readback)
    parts = {c: max(0.0, saving(c)) if c in present else 0.0 for c in FORWARD_PARTS}
    parts |= {"other": median(skeleton, None), "readback": read_s}
    closure = (sum(parts.values()) - read_s) / forward_s - 1.0
    by_phase = {p: median(whole, p) for p in PHASES}
    # unclamped: a phase whose parts' subtractions come out negative shows it
    part_phases = {c: {p: saving(c, p) for p in PHASES} for c in present} | {
        "other": {p: median(skeleton, p) for p in PHASES}
    }
    phase_closure = {
        p: sum(c[p] for c in part_phases.values()) / by_phase[p] - 1.0 if by_phase[p] > 0 else 0.0 for p in PHASES
    }
    collections = statistics.mean(t.collections for t in whole)
    return ForwardSplit(parts, forward_s, closure, by_phase, phase_closure, collections, part_phases)


@dataclass(frozen=True)
class _Step:
    """One engine step: its seconds (``whole``) and the engine parts (``ENGINE_PARTS``) timed inside it."""

    whole: float
    drafting: float = 0.0
    acceptance: float = 0.0
    rollback: float = 0.0
    logging: float = 0.0
    host: float = 0.0


@dataclass
class _Totals:
    """Seconds spent inside the wrapped calls since the last step."""

    verify: float = 0.0
    rollback: float = 0.0
    logging: float = 0.0


def _wrap(owner: Any, name: str, totals: _Totals, part: str) -> None:
    """Time every call of ``owner.name`` (an instance attribute from now on) into ``totals.<part>``."""
    inner = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            setattr(totals, part, getattr(totals, part) + time.perf_counter() - start)

    setattr(owner, name, timed)


def _acceptance_seconds(width: int, vocab: int, repeats: int = 200) -> float:
    """Seconds of the greedy acceptance rule on a draft of ``width - 1`` tokens, timed alone."""
    rng = np.random.default_rng(0)
    draft, targets = rng.integers(0, vocab, width - 1).tolist(), rng.integers(0, vocab, width).tolist()
    start = time.perf_counter()
    for _ in range(repeats):
        accept_greedy(draft, targets)
    return (time.perf_counter() - start) / repeats


def _engine_round(
    model: nn.Module, cache: list[Any], restore: CacheRestore, rollback: Any, tokens: mx.array, first: int, steps: int
) -> list[_Step]:
    """One timing round of the whole step at width w = tokens.shape[1]: per speculative step (drafts rejected) but
    the first, its seconds and the engine parts timed inside it (``host``: the loop's Python outside drafting, the
    target's verification and logging); at width 1 as many serial forwards, no engine parts. The cache is restored."""
    width = tokens.shape[1]
    if width == 1:
        return [_Step(time_verify(FAST, model, cache, tokens, restore, rollback)) for _ in range(steps - 1)]
    # steps + width tokens: ``steps`` verifications at full width, then narrower ones near the end (left out)
    gen = rejected_drafts(model, cache, first, width, steps + width)
    totals = _Totals()
    _wrap(gen.target, "verify", totals, "verify")
    inner = gen.target.inner.rollback  # the model target's, inside the pipeline
    _wrap(inner, "before_verify", totals, "rollback")
    _wrap(inner, "rewind", totals, "rollback")
    _wrap(gen.log, "append", totals, "logging")
    timed, last = [], None
    for _ in gen:
        now = time.perf_counter()
        record = gen.log.records[-1]
        if last is not None and record.kind == "verify" and record.verify_width == width:
            step, draft = now - last, record.draft_s
            host = step - draft - totals.verify - totals.logging
            timed.append(_Step(step, draft, 0.0, totals.rollback, totals.logging, host))
        totals.verify = totals.rollback = totals.logging = 0.0
        last = now
    restore()
    return timed[1:]


def measure_components(
    model: nn.Module,
    widths: Sequence[int] = (1, 2, 5),
    offset: int = 256,
    repeats: int = 3,
    steps: int = 6,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    forward_repeats: int = 31,
) -> list[dict[str, Any]]:
    """The component stack of a speculative step at each width (fast verification), one row per (width, part)
    (``ComponentRow``): the forward's parts over ``forward_repeats``, the engine's medians over ``repeats`` rounds
    run between them, and the whole step's; ``step_spread`` is its interquartile range over its median (the noise
    ``error`` is read against). Width 1 holds the forward's components against a serial width-1 forward."""
    if not widths or min(widths) < 1 or repeats < 1 or steps < 2 or offset < 1 or forward_repeats < 1:
        raise ValueError("widths must be >= 1, repeats and forward_repeats >= 1, steps >= 2 and offset >= 1")
    limit = context_length(model)
    if limit is not None and offset + max(widths) > limit:
        raise ValueError(f"component widths up to {max(widths)} with {offset} cached tokens exceed the context {limit}")
    rng = np.random.default_rng(seed)
    vocab = vocab_size(model)
    rows: list[dict[str, Any]] = []
    with wired_limit(model, [generation_stream]), mx.stream(generation_stream):
        cache = prefill(model, rng.integers(0, vocab, size=offset).tolist())
        restore = CacheRestore(cache)
        first = int(rng.integers(0, vocab))
        plain = statistics.median(time_plain(model, cache, first, steps, restore) for _ in range(2))
        rollback = rollback_for(model, cache)
        every = max(1, (1 + forward_repeats) // (1 + repeats))
        for w in sorted(set(widths)):
            tokens = mx.array(rng.integers(0, vocab, size=w).tolist(), dtype=mx.uint32)[None]
            # the engine's rounds interleaved with the forward's, spread over the same span of time, so that a
            # machine whose speed drifts (a busy one) times both alike
            # (the first round warms up and is left out)
            rounds: list[list[_Step]] = []

            def engine_round(r: int, tokens: mx.array = tokens, rounds: list[list[_Step]] = rounds) -> None:
                if r % every == 0 and len(rounds) < 1 + repeats:
                    rounds.append(_engine_round(model, cache, restore, rollback, tokens, first, steps))

            split = forward_components(model, cache, tokens, restore, forward_repeats, engine_round)
            while len(rounds) < 1 + repeats:
                rounds.append(_engine_round(model, cache, restore, rollback, tokens, first, steps))
            timed = [step for steps_ in rounds[1:] for step in steps_]
            # medians, as the profile's c(w) and the forward's parts are timed
            parts = split.parts | {p: statistics.median(getattr(step, p) for step in timed) for p in ENGINE_PARTS}
            parts |= {"acceptance": _acceptance_seconds(w, vocab) if w > 1 else 0.0}
            whole = statistics.median(step.whole for step in timed)
            low, high = np.percentile([step.whole for step in timed], [25, 75])
            total = sum(parts.values())
            error = total / whole - 1.0
            if progress is not None:
                progress(
                    f"width {w}: parts {1e3 * total:.1f} ms, measured {1e3 * whole:.1f} ms;"
                    f" forward components {split.closure:+.1%} off the forward's {1e3 * split.forward_s:.1f} ms"
                )
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
                        "step_spread": float(high - low) / whole,
                        "forward_s": split.forward_s,
                        "closure": split.closure,
                        **{f"forward_{p}_s": split.phases[p] for p in PHASES},
                        **{f"{p}_closure": split.phase_closure[p] for p in PHASES},
                        "collections": split.collections,
                        "host_s": _host_seconds(split, part, parts[part]),
                    }
                )
    return rows


def _host_seconds(split: ForwardSplit, part: str, seconds: float) -> float:
    """A part's seconds counted by phase: a forward component's host work (its subtraction within building and
    dispatching the graph, 0 where noise makes it negative); readback and the engine's parts as timed."""
    if part in split.part_phases:
        return max(0.0, sum(split.part_phases[part][p] for p in HOST_PHASES))
    return 0.0 if part in FORWARD_PARTS and part != "readback" else seconds


@dataclass(frozen=True)
class ComponentRow:
    """A row of ``measure_components`` (or ``phase_stack``) as the stack's readers read it; the rows are stored as
    dicts (a profile's ``components``), and an older run's lack some keys (their defaults here)."""

    width: int
    part: str
    seconds: float = 0.0
    device: str = ""
    error: float = 0.0
    c: float = 0.0
    c_step: float = 0.0
    step_s: float = 0.0
    plain_step_s: float = 0.0
    forward_s: float = 0.0
    closure: float | None = None
    step_spread: float | None = None
    forward_build_s: float = 0.0
    forward_dispatch_s: float = 0.0
    forward_wait_s: float = 0.0
    build_closure: float = 0.0
    dispatch_closure: float = 0.0
    host_s: float = 0.0

    @classmethod
    def rows(cls, rows: Sequence[Mapping[str, Any]]) -> list[ComponentRow]:
        names = {f.name for f in fields(cls)}
        return [cls(**{k: v for k, v in r.items() if k in names}) for r in rows]


def phase_reading(rows: Sequence[dict[str, Any]]) -> dict[int, dict[str, float]] | None:
    """Per width, from ``measure_components`` rows: ``wait_share``, the share of the forward spent waiting for the
    device after the host's last work (near 0: host-bound; large: device-bound); ``host_closure``, how far the
    components' subtractions add up within build and dispatch alone; ``phase_error``, how far the parts counted by
    phase (each component's host work, the wait whole, readback and the engine's parts) are from the measured
    step. None for rows without phases (an older run)."""
    stack = ComponentRow.rows(rows)
    reading = {}
    for row, r in zip(rows, stack):
        if r.part != PARTS[0] or row.get("forward_wait_s") is None:
            continue
        build, dispatch = r.forward_build_s, r.forward_dispatch_s
        host = build * (1 + r.build_closure) + dispatch * (1 + r.dispatch_closure)
        rest = sum(q.seconds for q in stack if q.width == r.width and q.part in ("readback", *ENGINE_PARTS))
        reading[r.width] = {
            "wait_share": r.forward_wait_s / r.forward_s,
            "host_closure": host / (build + dispatch) - 1.0 if build + dispatch > 0 else 0.0,
            "phase_error": (host + r.forward_wait_s + rest) / r.step_s - 1.0,
        }
    return reading or None


#: The part a stack counted by phase adds: the forward's wait for the device after the host's last work.
WAIT = "wait"


def phase_stack(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """``measure_components`` rows counted by phase: each part's ``seconds`` and ``c`` its host work (``host_s``),
    a ``WAIT`` row per width holding the forward's wait for the device, and ``error`` the count's miss against the
    measured step (``phase_reading``'s ``phase_error``; a part whose host work comes out below zero is drawn as 0).
    None for rows without the parts' phases (a CPU's stack is drawn as measured: its host does the device's work; or
    rows of an older run)."""
    stack = ComponentRow.rows(rows)
    reading = phase_reading(rows) if rows and all(r.get("host_s") is not None for r in rows) else None
    if reading is None or any(str(r.device).startswith("cpu") for r in stack):
        return None
    counted = []
    for w in sorted(reading):
        at_w = [(row, r) for row, r in zip(rows, stack) if r.width == w]
        error = reading[w]["phase_error"]
        counted += [{**row, "seconds": r.host_s, "c": r.host_s / r.plain_step_s, "error": error} for row, r in at_w]
        row, first = at_w[0]
        wait = {"part": WAIT, "group": "forward", "seconds": first.forward_wait_s}
        counted.append({**row, **wait, "c": first.forward_wait_s / first.plain_step_s, "error": error})
    return counted


def deciding_part(rows: Sequence[dict[str, Any]]) -> tuple[str, float]:
    """The part whose seconds grow most from the narrowest to the widest width measured, and its share of
    that growth: what decides how fast c(w) rises (a verification's extra cost)."""
    stack = ComponentRow.rows(rows)
    widths = sorted({r.width for r in stack})
    if len(widths) < 2:
        raise ValueError("the deciding part needs stacks at two widths at least")
    at = {(r.width, r.part): r.seconds for r in stack}
    growth = {p: at.get((widths[-1], p), 0.0) - at.get((widths[0], p), 0.0) for p in PARTS}
    total = sum(max(g, 0.0) for g in growth.values())
    part = max(growth, key=growth.__getitem__)
    return part, growth[part] / total if total > 0 else 0.0
