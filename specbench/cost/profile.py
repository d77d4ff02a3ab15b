"""Verify-cost profiles and break-even math.

A profile holds c(w): the time of a width-w verification (one forward of w tokens, the
greedy targets read back to the host) divided by the time of one plain decode step, for
w = 1..W and each verify mode; the engine's own overhead per speculative step (drafting
excluded), in plain steps; and each drafter's cost per draft token d in plain steps.
Plain steps are timed through the engine, pipelined as mlx-lm decodes (the next step queued
before the current token is read), so c(1) is usually above 1: a verification cannot be
pipelined that way.

Break-even, with per-position acceptance a_i (the probability draft token i is accepted
given the earlier ones were), and c including the engine's step overhead:

    E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i        tokens per verification
    S(k) = E(k) / (c(k+1) + k d)                  speedup over plain decoding

Profiles are stored as JSON under ``$SPECBENCH_HOME/profiles`` (default
``~/.cache/specbench``), keyed by model shape, device and mlx / mlx-lm versions.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import re
import statistics
import tempfile
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.generate import generation_stream, wired_limit
from mlx_lm.models.cache import make_prompt_cache

from specbench.common.files import home
from specbench.common.identity import device_name, display_name, model_key, versions
from specbench.drafters.base import Draft, Drafter, as_draft

VERIFY_MODES = ("fast", "exact")
QUICK_WIDTHS = (1, 2, 3, 5, 9)  # what quick_profile times, as time allows


# -- profiles -------------------------------------------------------------------------------


@dataclass
class Profile:
    """Verify cost c(w) per verify mode, and drafter costs, of one model on one device."""

    model: str
    name: str
    device: str
    versions: dict[str, str]
    plain_step_s: float
    #: mode -> the widths measured in that verify mode.
    widths: dict[str, list[int]]
    #: mode -> c(w) for each of ``widths[mode]``.
    costs: dict[str, list[float]]
    #: mode -> median seconds of a width-w verification for each of ``widths[mode]``.
    seconds: dict[str, list[float]]
    #: mode -> the engine's own time per speculative step beyond the forward (drafting excluded),
    #: in plain steps; absent when it could not be measured.
    overhead: dict[str, float] = field(default_factory=dict)
    #: drafter name -> {"k": draft length timed, "d": cost per draft token in plain steps, "draft_s": ...}
    drafters: dict[str, dict[str, float]] = field(default_factory=dict)
    offset: int = 0
    repeats: int = 0
    created: str = ""
    quick: bool = False

    def c(self, w: int | float, mode: str = "fast", overhead: bool = True) -> float:
        """Cost of a width-w verification step in plain steps (see ``curve``)."""
        return cost_at(self.curve(mode, overhead), w)

    def curve(self, mode: str = "fast", overhead: bool = True) -> np.ndarray:
        """c(1..W) as an array (index w-1), unmeasured widths interpolated; with ``overhead`` the
        engine's per-step overhead is added (what a speculative step costs end to end)."""
        if mode not in self.costs:
            raise ValueError(
                f"the profile of {self.name} on {self.device} has no {mode!r} verify costs "
                f"(it has {', '.join(self.costs) or 'none'}): measure it with verify=({mode!r},)"
            )
        widths = self.widths[mode]
        curve = np.interp(np.arange(1, max(widths) + 1), widths, self.costs[mode])
        return curve + (self.overhead.get(mode, 0.0) if overhead else 0.0)

    def drafter_cost(self, drafter: Drafter | str) -> float | None:
        name = drafter if isinstance(drafter, str) else getattr(drafter, "name", None)
        entry = self.drafters.get(name) if name else None
        return None if entry is None else float(entry["d"])

    @property
    def key(self) -> dict[str, str]:
        return {"model": self.model, "device": self.device, "mlx": self.versions.get("mlx", ""),
                "mlx_lm": self.versions.get("mlx_lm", "")}

    def path(self, root: Path | None = None) -> Path:
        return profile_path(self.model, self.device, self.versions, root)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Profile":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_polars(self):
        """One row per (mode, width): c and seconds, plus the profile's key columns."""
        import polars as pl

        rows = []
        for mode, costs in self.costs.items():
            for w, c, s in zip(self.widths[mode], costs, self.seconds[mode]):
                rows.append({
                    "model": self.model, "name": self.name, "device": self.device,
                    "mlx": self.versions.get("mlx"), "mlx_lm": self.versions.get("mlx_lm"),
                    "mode": mode, "width": w, "c": c, "seconds": s, "overhead": self.overhead.get(mode, 0.0),
                    "plain_step_s": self.plain_step_s, "offset": self.offset, "created": self.created,
                })
        return pl.DataFrame(rows)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()


def profile_path(model: str, device: str, vers: dict[str, str], root: Path | None = None) -> Path:
    root = (root or home()) / "profiles"
    return root / f"{_slug(model)}--{_slug(device)}--mlx{vers.get('mlx')}--mlxlm{vers.get('mlx_lm')}.json"


def save_profile(profile: Profile, root: Path | None = None) -> Path:
    """Write a profile atomically, keeping modes and drafters an earlier profile of the same key has
    and this one lacks."""
    path = profile.path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = profile.to_dict()
    if path.exists():
        old = json.loads(path.read_text())
        for part in ("widths", "costs", "seconds", "overhead", "drafters"):
            data[part] = {**old.get(part, {}), **data[part]}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load_profile(model: nn.Module | str, device: str | None = None, root: Path | None = None) -> Profile | None:
    """The stored profile of ``model`` (a model or its ``model_key``) on this device and these
    library versions, or None."""
    key = model if isinstance(model, str) else model_key(model)
    path = profile_path(key, device or device_name(), versions(), root)
    if not path.exists():
        return None
    return Profile.from_dict(json.loads(path.read_text()))


def load_profiles(root: Path | None = None):
    """Every stored profile as one polars DataFrame (see ``Profile.to_polars``)."""
    import polars as pl

    folder = (root or home()) / "profiles"
    frames = [Profile.from_dict(json.loads(p.read_text())).to_polars() for p in sorted(folder.glob("*.json"))]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


# -- measuring ------------------------------------------------------------------------------


class _CacheRestore:
    """Puts caches back to where they were when this was made: trims key-value caches to their
    saved length and restores the saved arrays of recurrent ones."""

    def __init__(self, cache: list[Any]):
        self.cache = cache
        self.saved = [c.offset if c.is_trimmable() else (list(c.state[0]), *c.state[1:]) for c in cache]

    def __call__(self) -> None:
        for c, saved in zip(self.cache, self.saved):
            if isinstance(saved, int):
                c.trim(c.offset - saved)
            else:
                c.state = (list(saved[0]), *saved[1:])


def _mode_context(model: nn.Module, mode: str):
    if mode == "fast":
        return contextlib.nullcontext()
    if mode == "exact":
        try:
            from specbench.exact.hooks import exact_mode
        except ImportError as e:
            raise ValueError("verify mode 'exact' needs specbench.exact, which is not installed") from e
        return exact_mode(model)
    raise ValueError(f"verify mode must be one of {VERIFY_MODES}, got {mode!r}")


def available_modes() -> tuple[str, ...]:
    try:
        from specbench.exact.hooks import exact_mode  # noqa: F401
    except ImportError:
        return ("fast",)
    return VERIFY_MODES


def _vocab(model: nn.Module) -> int:
    lm = getattr(model, "language_model", model)
    args = getattr(lm, "args", None)
    return int(getattr(args, "vocab_size", 0) or lm.model.embed_tokens.weight.shape[0])


def _prefill(model: nn.Module, tokens: Sequence[int]) -> list[Any]:
    cache = make_prompt_cache(model)
    for i in range(0, len(tokens), 512):
        model(mx.array(tokens[i : i + 512])[None], cache=cache)
        mx.eval([c.state for c in cache])
    return cache


def _rollback(model: nn.Module, cache: list[Any]) -> Any:
    """The engine's cache rollback for these caches (it records recurrent layers during a
    verification, which changes what a hybrid model's verify computes), or None if it refuses."""
    from specbench.core.rollback import CacheRollback

    try:
        return CacheRollback(cache, model)
    except ValueError:
        return None


def _time_verify(
    model: nn.Module, cache: list[Any], tokens: mx.array, restore: _CacheRestore, rollback: Any = None
) -> float:
    """Seconds of one width-w forward with the greedy targets read back, as the engine verifies."""
    if rollback is not None:
        rollback.before_verify(tokens.shape[1])
    mx.synchronize()
    t0 = time.perf_counter()
    logits = model(tokens, cache=cache)
    mx.argmax(logits[0], axis=-1).tolist()
    seconds = time.perf_counter() - t0
    if rollback is not None:
        rollback.rewind(0)
    restore()
    return seconds


def _timed_decode(generation: Any, excluded: Callable[[], float] = lambda: 0.0) -> float:
    """Iterate a generation; seconds per token after the first (the prompt pass excluded), less
    the growth of ``excluded()`` (seconds spent on bookkeeping that is not decoding)."""
    count, t_first, x_first = 0, 0.0, 0.0
    for _ in generation:
        count += 1
        if count == 1:
            t_first, x_first = time.perf_counter(), excluded()
    if count < 2:
        raise ValueError("a timed generation needs at least 2 tokens: raise max_tokens")
    return (time.perf_counter() - t_first - (excluded() - x_first)) / (count - 1)


def _time_plain(model: nn.Module, cache: list[Any], first: int, n: int, restore: _CacheRestore) -> float:
    """Seconds per token of ``n`` plain greedy steps through the engine (pipelined as mlx-lm
    decodes) after the cached context."""
    from specbench.core.engine import GenerateOptions, generate

    seconds = _timed_decode(generate(model, [first], GenerateOptions(max_tokens=n + 1, ignore_eos=True), prompt_cache=cache))
    restore()
    return seconds


class _RandomDrafter(Drafter):
    """Proposes uniformly random tokens: nearly every draft is rejected, so each engine step
    verifies the full width and emits one token."""

    name = "random"

    def __init__(self, vocab: int, seed: int = 0):
        self.vocab = vocab
        self.rng = np.random.default_rng(seed)

    def draft(self, context: Sequence[int], k: int) -> Draft:
        return Draft(self.rng.integers(0, self.vocab, size=k).tolist())


def _time_engine_step(
    model: nn.Module, cache: list[Any], first: int, steps: int, width: int, mode: str, restore: _CacheRestore
) -> tuple[float, float]:
    """(seconds per speculative engine step of ``width``, of which drafting), from ``steps``
    steps whose random drafts are rejected."""
    from specbench.core.engine import GenerateOptions, speculative_generate
    from specbench.core.policies import DraftPolicy

    options = GenerateOptions(max_tokens=steps + 1, ignore_eos=True, verify=mode)
    gen = speculative_generate(
        model, [first], options, _RandomDrafter(_vocab(model)), DraftPolicy.fixed(width - 1), prompt_cache=cache
    )
    per_token = _timed_decode(gen)
    restore()
    decode = [r for r in gen.log if r["kind"] != "prefill"]
    verifies = [r for r in decode if r["kind"] == "verify"]
    seconds = per_token * (len(gen.tokens) - 1) / len(decode)
    return seconds, statistics.median(r["draft_s"] for r in verifies) if verifies else 0.0


def _widths(widths: int | Iterable[int]) -> list[int]:
    ws = list(range(1, widths + 1)) if isinstance(widths, int) else sorted({int(w) for w in widths})
    if not ws or ws[0] < 1:
        raise ValueError(f"widths must be a positive integer W (for 1..W) or positive widths, got {widths!r}")
    if ws[0] != 1:
        ws = [1, *ws]
    return ws


def measure(
    model: nn.Module,
    widths: int | Iterable[int] | dict[str, int | Iterable[int]] = 16,
    verify: Sequence[str] = ("fast",),
    offset: int = 512,
    repeats: int = 10,
    warmup: int = 2,
    plain_tokens: int = 16,
    overhead_widths: Sequence[int] | None = None,
    drafters: Sequence[Drafter] = (),
    draft_k: int = 4,
    context: Sequence[int] | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> Profile:
    """Measure a cost profile: c(w) for each width and verify mode, the engine's overhead per
    speculative step, and each drafter's d.

    ``widths``: W (for 1..W), a list of widths, or a dict of either per verify mode. The cache
    holds ``offset`` tokens (``context`` when given, else random ids) for every timed forward and
    is restored after each. Widths are timed round-robin with ``plain_tokens`` plain steps per
    round; ``warmup`` rounds are discarded and medians of ``repeats`` rounds kept.
    The overhead is timed at ``overhead_widths`` (default: 2, the middle and the widest; one
    warm-up run, then medians of ``repeats // 3`` runs of ``plain_tokens`` steps) when the engine
    can decode the model speculatively; it is left out otherwise.
    """
    modes = [verify] if isinstance(verify, str) else list(verify)
    for mode in modes:
        if mode not in VERIFY_MODES:
            raise ValueError(f"verify mode must be one of {VERIFY_MODES}, got {mode!r}")
    if isinstance(widths, dict):
        missing = [m for m in modes if m not in widths]
        if missing:
            raise ValueError(f"widths gives no widths for verify mode(s) {missing}")
        ws = {m: _widths(widths[m]) for m in modes}
    else:
        ws = {m: _widths(widths) for m in modes}
    if repeats < 1 or warmup < 0 or offset < 1 or plain_tokens < 1:
        raise ValueError("repeats, offset and plain_tokens must be >= 1 and warmup >= 0")
    rng = np.random.default_rng(seed)
    vocab = _vocab(model)
    if context is None:
        context = rng.integers(0, vocab, size=offset).tolist()
    context = list(context)[-offset:]
    probe = mx.array(rng.integers(0, vocab, size=max(max(w) for w in ws.values())).tolist(), dtype=mx.uint32)[None]
    first = int(probe[0, 0].item())

    def say(text: str) -> None:
        if progress is not None:
            progress(text)

    with wired_limit(model, [generation_stream]), mx.stream(generation_stream):
        cache = _prefill(model, context)
        restore = _CacheRestore(cache)
        rollback = _rollback(model, cache)
        verify_s: dict[str, dict[int, list[float]]] = {m: {w: [] for w in ws[m]} for m in modes}
        plain_s: list[float] = []
        for round_ in range(warmup + repeats):
            keep = round_ >= warmup
            t = _time_plain(model, cache, first, plain_tokens, restore)
            if keep:
                plain_s.append(t)
            for mode in modes:
                with _mode_context(model, mode):
                    for w in ws[mode]:
                        t = _time_verify(model, cache, probe[:, :w], restore, rollback)
                        if keep:
                            verify_s[mode][w].append(t)
            if keep:
                say(f"round {round_ - warmup + 1}/{repeats}: plain step {1e3 * plain_s[-1]:.2f} ms")
        plain = statistics.median(plain_s)
        seconds = {m: [statistics.median(verify_s[m][w]) for w in ws[m]] for m in modes}
        overhead = {}
        for mode in modes if rollback is not None else ():
            chosen = sorted(set(overhead_widths or (2, ws[mode][len(ws[mode]) // 2], ws[mode][-1])) & set(ws[mode]) - {1})
            excess = []
            try:
                for w in chosen:
                    runs = [_time_engine_step(model, cache, first, plain_tokens, w, mode, restore)
                            for _ in range(1 + max(1, len(plain_s) // 3))][1:]
                    step_s = statistics.median(step for step, _ in runs)
                    draft_s = statistics.median(draft for _, draft in runs)
                    excess.append((step_s - draft_s - seconds[mode][ws[mode].index(w)]) / plain)
            except ValueError as err:  # the engine cannot decode this model speculatively
                restore()
                say(f"{mode}: engine overhead not measured ({err})")
                continue
            overhead[mode] = max(0.0, statistics.median(excess)) if excess else 0.0
            say(f"{mode}: engine overhead {overhead[mode]:.3f} plain steps per speculative step")
        drafter_costs = {
            d.name: measure_drafter(model, d, context, draft_k, plain, repeats=max(3, len(plain_s)))
            for d in drafters
        }
    return Profile(
        model=model_key(model),
        name=display_name(model),
        device=device_name(),
        versions=versions(),
        plain_step_s=plain,
        widths=ws,
        costs={m: [s / plain for s in seconds[m]] for m in modes},
        seconds=seconds,
        overhead=overhead,
        drafters=drafter_costs,
        offset=len(context),
        repeats=len(plain_s),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )


def measure_drafter(
    model: nn.Module,
    drafter: Drafter,
    context: Sequence[int],
    k: int,
    plain_step_s: float,
    repeats: int = 5,
) -> dict[str, float]:
    """Time ``drafter.draft(context, k)`` in steady state, as the engine calls it: the drafter
    begins on all but the last ``repeats + 1`` context tokens, then observes them one at a time
    (with their hidden states when it needs them), drafting after each.
    d = median seconds per requested token / plain step."""
    context = list(context)
    if len(context) < repeats + 3:
        raise ValueError(f"timing a drafter needs a context of at least {repeats + 3} tokens, got {len(context)}")
    start = len(context) - repeats - 1
    hidden = None
    if drafter.needs_hidden:
        from specbench.core.forward import text_model

        hidden = text_model(model).model(mx.array(context)[None], cache=make_prompt_cache(model))
        mx.eval(hidden)
    drafter.begin(context[:start], hidden[:, : start - 1] if hidden is not None else None)
    times, drafted = [], []
    try:
        for i in range(start, len(context)):
            drafter.observe([context[i]], hidden[:, i - 1 : i] if hidden is not None else None)
            t0 = time.perf_counter()
            proposal = as_draft(drafter.draft(context[: i + 1], k), k)
            if proposal.probs is not None:
                mx.eval(proposal.probs)
            if i > start:  # the first draft warms up
                times.append(time.perf_counter() - t0)
                drafted.append(len(proposal.tokens))
    finally:
        drafter.end()
    draft_s = statistics.median(times)
    return {"k": k, "drafted": statistics.mean(drafted), "draft_s": draft_s, "d": draft_s / k / plain_step_s}


# -- profile_for: what policies read -----------------------------------------------------------

_MEMORY: dict[tuple[int, str], Profile] = {}


def _remember(model: nn.Module, verify: str, profile: Profile) -> None:
    key = (id(model), verify)
    if key not in _MEMORY:
        weakref.finalize(model, _MEMORY.pop, key, None)
    _MEMORY[key] = profile


def profile_for(model: nn.Module, verify: str = "fast", budget_s: float = 2.5) -> Profile:
    """The cost profile to plan with: a stored one for this model, device and library versions
    if present, else ``quick_profile`` (about ``budget_s`` seconds); kept in memory per model
    object."""
    cached = _MEMORY.get((id(model), verify))
    if cached is not None:
        return cached
    profile = load_profile(model)
    if profile is None or verify not in profile.costs:
        profile = quick_profile(model, verify, budget_s)
    _remember(model, verify, profile)
    return profile


def quick_profile(model: nn.Module, verify: str = "fast", budget_s: float = 2.5, offset: int = 8) -> Profile:
    """A rough profile within about ``budget_s`` seconds: widths 1, 2, 5, 3, 9 timed in that order
    as long as time is left (at least 1, 2 and 5), then again while over a third of the budget
    is left (medians kept), after a short context; the plain step taken as a serial width-1 step
    (so c(1) = 1); and the engine overhead at width 5 when there is time for it. Unmeasured
    widths are interpolated."""
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    vocab = _vocab(model)
    probe = mx.array(rng.integers(0, vocab, size=max(QUICK_WIDTHS)).tolist(), dtype=mx.uint32)[None]
    # GPUs compile kernels on first use: warm each width up there before timing it.
    warm = mx.default_device().type == mx.DeviceType.gpu
    seconds: dict[int, Any] = {}
    with wired_limit(model, [generation_stream]), mx.stream(generation_stream):
        cache = _prefill(model, rng.integers(0, vocab, size=offset).tolist())
        restore = _CacheRestore(cache)
        rollback = _rollback(model, cache)
        with _mode_context(model, verify):
            _time_verify(model, cache, probe[:, :1], restore, rollback)
            for w in (1, 2, 5, 3, 9):
                spent = time.perf_counter() - started
                if len(seconds) >= 3 and spent + (2 if warm else 1) * seconds[1][0] * w > budget_s:
                    break
                if warm and w > 1:
                    _time_verify(model, cache, probe[:, :w], restore, rollback)
                seconds[w] = [_time_verify(model, cache, probe[:, :w], restore, rollback)]
            # Fast models: more rounds while a good part of the budget is left (medians kept).
            round_s = sum(s[0] for s in seconds.values())
            for _ in range(6):
                if time.perf_counter() - started + round_s > 0.6 * budget_s:
                    break
                for w in seconds:
                    seconds[w].append(_time_verify(model, cache, probe[:, :w], restore, rollback))
        seconds = {w: statistics.median(s) for w, s in seconds.items()}
        plain = seconds[1]
        overhead = {}
        if rollback is not None and time.perf_counter() - started + 12 * seconds[5] < budget_s:
            try:
                step_s, draft_s = _time_engine_step(model, cache, int(probe[0, 0].item()), 4, 5, verify, restore)
                overhead[verify] = max(0.0, (step_s - draft_s - seconds[5]) / plain)
            except ValueError:
                restore()
    ws = sorted(seconds)
    return Profile(
        model=model_key(model), name=display_name(model), device=device_name(), versions=versions(),
        plain_step_s=plain, widths={verify: ws}, costs={verify: [seconds[w] / plain for w in ws]},
        seconds={verify: [seconds[w] for w in ws]}, overhead=overhead, offset=offset, repeats=1,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), quick=True,
    )


def drafter_cost(drafter: Drafter | None, profile: Profile | None = None) -> float:
    """A drafter's cost per draft token in plain steps: the profile's measurement of it if there
    is one, else the drafter's own ``cost_per_token``."""
    if drafter is None:
        return 0.0
    measured = profile.drafter_cost(drafter) if profile is not None else None
    return measured if measured is not None else float(getattr(drafter, "cost_per_token", 0.0) or 0.0)


def break_even_tokens(
    model: nn.Module | Profile, k: int, drafter: Drafter | None = None, d: float | None = None, verify: str = "fast"
) -> float:
    """Tokens a verification of ``k`` drafts must yield on average to match plain decoding:
    c(k+1) + k d (from ``profile_for(model)`` when given a model)."""
    profile = model if isinstance(model, Profile) else profile_for(model, verify)
    d = drafter_cost(drafter, profile) if d is None else d
    return profile.c(k + 1, verify) + k * d


def preferred_k(
    model: nn.Module | Profile, acceptance: float | Sequence[float], drafter: Drafter | None = None,
    k_max: int = 8, verify: str = "fast",
) -> int:
    """The draft length with the best predicted speedup at ``acceptance`` (0: do not draft)."""
    profile = model if isinstance(model, Profile) else profile_for(model, verify)
    return best_k(acceptance, profile.curve(verify), drafter_cost(drafter, profile), k_max)[0]


# -- break-even math ------------------------------------------------------------------------


def cost_at(costs: Sequence[float] | np.ndarray, w: int | float) -> float:
    """c(w) from c(1..W) (index w-1): linear between widths; past W, extended at the mean slope
    of c over 1..W."""
    c = np.asarray(costs, dtype=float)
    if w < 1:
        raise ValueError(f"width must be >= 1, got {w}")
    if w <= len(c):
        return float(np.interp(w, np.arange(1, len(c) + 1), c))
    if len(c) == 1:
        return float(c[0] * w)
    return float(c[-1] + (c[-1] - c[0]) / (len(c) - 1) * (w - len(c)))


def _curve(costs: "Profile | Sequence[float]", mode: str = "fast") -> np.ndarray:
    return costs.curve(mode) if isinstance(costs, Profile) else np.asarray(costs, dtype=float)


def expected_tokens(acceptance: float | Sequence[float], k: int) -> float:
    """E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i; a scalar means every a_i equals it."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if np.ndim(acceptance) == 0:
        a = np.full(k, float(acceptance))
    else:
        a = np.asarray(acceptance, dtype=float)
        if len(a) < k:
            raise ValueError(f"acceptance has {len(a)} positions, fewer than k={k}")
        a = a[:k]
    if np.any((a < 0) | (a > 1)):
        raise ValueError("acceptance probabilities must lie in [0, 1]")
    return float(1.0 + np.cumprod(a).sum())


def speedup(
    acceptance: float | Sequence[float], k: int, costs: "Profile | Sequence[float]", d: float = 0.0, mode: str = "fast"
) -> float:
    """S(k) = E(k) / (c(k+1) + k d); S(0) = 1 (plain decoding)."""
    if k == 0:
        return 1.0
    return expected_tokens(acceptance, k) / (cost_at(_curve(costs, mode), k + 1) + k * d)


def break_even_acceptance(
    costs: "Profile | Sequence[float]", d: float = 0.0, k_max: int | None = None, mode: str = "fast"
) -> np.ndarray:
    """a*(k) for k = 1..k_max: the constant acceptance at which S(k) = 1.

    0 where drafting k tokens pays even if all are rejected; NaN where it never pays (even with
    every draft accepted)."""
    c = _curve(costs, mode)
    k_max = k_max or len(c) - 1
    out = np.empty(k_max)
    for k in range(1, k_max + 1):
        target = cost_at(c, k + 1) + k * d
        if target <= 1.0:
            out[k - 1] = 0.0
        elif target > k + 1:
            out[k - 1] = np.nan
        else:
            lo, hi = 0.0, 1.0
            for _ in range(60):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if expected_tokens(mid, k) < target else (lo, mid)
            out[k - 1] = (lo + hi) / 2
    return out


def best_k(
    acceptance: float | Sequence[float], costs: "Profile | Sequence[float]", d: float = 0.0,
    k_max: int | None = None, mode: str = "fast",
) -> tuple[int, float]:
    """(k, S(k)) maximising the predicted speedup over k = 0..k_max (k = 0: plain decoding)."""
    c = _curve(costs, mode)
    k_max = k_max or len(c) - 1
    if np.ndim(acceptance) > 0:
        k_max = min(k_max, len(acceptance))
    best = (0, 1.0)
    for k in range(1, k_max + 1):
        s = speedup(acceptance, k, c, d)
        if s > best[1]:
            best = (k, s)
    return best


# -- measured, not only predicted ---------------------------------------------------------------


def predicted_from_log(records: Iterable[dict[str, Any]], costs: "Profile | Sequence[float]", d: float, mode: str = "fast") -> float:
    """Speedup the cost model predicts for the steps a run actually took: decode tokens divided by
    the sum over steps of c(width) + drafted * d (plain steps cost c(1))."""
    c = _curve(costs, mode)
    tokens, steps = 0, 0.0
    for r in records:
        if r["kind"] == "prefill":
            continue
        tokens += r["emitted"]
        steps += cost_at(c, r["verify_width"]) + r["k_drafted"] * d
    return tokens / steps if steps else 0.0


def speedup_grid(
    model: nn.Module,
    profile: Profile,
    acceptances: Sequence[float] = (0.5, 0.7, 0.8, 0.9, 1.0),
    ks: Sequence[int] = (1, 2, 4, 6, 8),
    verify: str = "fast",
    prompt_len: int | None = None,
    max_tokens: int = 128,
    repeats: int = 1,
    seed: int = 0,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Speedups measured end to end with the controlled-acceptance drafter, against prediction.

    For each (acceptance a, draft length k): a plain greedy run and a speculative run
    (``OracleDrafter`` at a, ``DraftPolicy.fixed(k)``) of ``max_tokens`` tokens from one random
    prompt, back to back. Each row holds the measured speedup (plain over speculative seconds
    per token), the prediction at the nominal a (``speedup``), the prediction for the steps the
    run took (``predicted_from_log``) and their relative errors; and the seconds per speculative
    token the profile predicts for those steps (``predicted_spec_s_per_token``) with its error
    (``error_time``; ``error_time_nominal`` at the nominal a), which leaves out how far the plain
    run's own speed strays from the profile's plain step (``plain_over_profile``). Where a fast verify leaves the
    plain greedy output (``diverged_at``), the drafter follows the new output (``follows`` times);
    that bookkeeping is left out of the timings.
    """
    from specbench.drafters.oracle import OracleDrafter
    from specbench.core.engine import GenerateOptions, generate, speculative_generate
    from specbench.core.policies import DraftPolicy

    if verify not in profile.costs:
        raise ValueError(f"the profile has no {verify!r} verify costs: measure it with verify=({verify!r},)")
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, _vocab(model), size=prompt_len or profile.offset or 64).tolist()
    plain_options = GenerateOptions(max_tokens=max_tokens, ignore_eos=True)
    spec_options = GenerateOptions(max_tokens=max_tokens, ignore_eos=True, verify=verify)
    drafter = OracleDrafter.from_model(model, prompt, max_tokens, 1.0, seed=seed, follow=True)
    for k in ks:  # warm-up: compile each width's kernels before timing
        warm = GenerateOptions(max_tokens=min(max_tokens, 2 * k + 4), ignore_eos=True, verify=verify)
        _timed_decode(speculative_generate(model, prompt, warm, drafter, DraftPolicy.fixed(k)))
    rows = []
    for cell, (k, a) in enumerate((k, a) for k in ks for a in acceptances):
        drafter.acceptance, drafter.seed = float(a), seed + cell
        plain_runs, spec_runs = [], []
        for _ in range(max(1, repeats)):
            plain_runs.append(_timed_decode(generate(model, prompt, plain_options)))
            gen = speculative_generate(model, prompt, spec_options, drafter, DraftPolicy.fixed(k))
            spec_runs.append(_timed_decode(gen, lambda: drafter.follow_s))
        plain_s, spec_s = statistics.median(plain_runs), statistics.median(spec_runs)
        stats = gen.stats()
        verifies = [r for r in gen.log if r["kind"] == "verify"]
        drafted = sum(r["k_drafted"] for r in verifies)
        accepted = sum(r["accepted"] for r in verifies)
        rejections = sum(1 for r in verifies if r["accepted"] < r["k_drafted"])
        draft_s = max(0.0, sum(r["draft_s"] for r in verifies) - drafter.follow_s)
        d = draft_s / drafted / plain_s if drafted else 0.0
        measured = plain_s / spec_s
        nominal = speedup(a, k, profile, d, verify)
        from_log = predicted_from_log(gen.log, profile, d, verify)
        row = {
            "model": profile.model, "name": profile.name, "device": profile.device, "mode": verify,
            "a": float(a), "k": int(k), "tokens": len(gen.tokens), "verifies": len(verifies),
            "plain_s_per_token": plain_s, "spec_s_per_token": spec_s, "speedup": measured,
            "tokens_per_verify": stats["tokens_per_verify"],
            "acceptance_measured": accepted / (accepted + rejections) if accepted + rejections else 1.0,
            "d": d, "step_cost": profile.c(k + 1, verify), "predicted_nominal": nominal, "predicted_from_log": from_log,
            "error_nominal": measured / nominal - 1.0, "error_from_log": measured / from_log - 1.0 if from_log else 0.0,
            # Seconds per speculative token predicted from the profile alone, and their error:
            # free of the plain run's own variation, which the speedup errors carry.
            "predicted_spec_s_per_token": profile.plain_step_s / from_log if from_log else None,
            "error_time": spec_s * from_log / profile.plain_step_s - 1.0 if from_log else 0.0,
            "error_time_nominal": spec_s * nominal / profile.plain_step_s - 1.0,
            "plain_step_s_profile": profile.plain_step_s, "plain_over_profile": plain_s / profile.plain_step_s,
            "diverged_at": drafter.diverged_at,
            "follows": drafter.follows,
        }
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows
