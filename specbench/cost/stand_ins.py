"""Standing in for a model's components: one forward recorded, then timed with some components' modules
answering from the record (``specbench.cost.components`` splits a verify's cost by subtraction with it).

``record_forward`` records every component call's inputs and output (``component_sites``); ``forward_with_stand_ins``
times the forward as the engine runs it, the named components answering at once, so that the rest of the graph
computes the same values (the logits equal bit for bit) without the stood-in work.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.models.switch_layers import SwitchGLU, SwitchMLP

from specbench.core.forward import text_model
from specbench.core.swap import mixed_class
from specbench.core.verify import FAST
from specbench.cost.timing import CacheRestore


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
