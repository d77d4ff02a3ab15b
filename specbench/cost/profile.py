"""Verify-cost profiles: what a model's verifications cost on one device, stored as JSON.

A profile holds c(w), a width-w verification's time (the greedy targets read back) over one plain decode step's,
per verify mode; the engine's overhead per speculative step and each drafter's cost per draft token d, in plain
steps; optionally the costs at other context lengths (``lengths``: c(w, L), ``at_length``) and the stack of a
step's parts (``components``). Stored under ``$SPECBENCH_HOME/profiles``, keyed by model shape, device, mlx /
mlx-lm versions and BLAS library (``kernel_key``); a damaged stored profile is moved aside with a warning and
measured anew.

How far a measured c(w) can be trusted: each timing round gives one ratio per width, its seconds over the round's
plain step; c(w)'s interval is the distribution-free interval of the median of those ratios, at the level the
number of rounds allows (``median_interval``). A profile whose speculative step costs below 1 at a width above 1,
or whose c(w) steps down between widths by more than the two intervals allow, is *noisy* (``noise``): pages that
plan with it say so, and the report's cost model measures it again, pooled (``specbench.cost.model``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import mlx.nn as nn
import numpy as np

from specbench.common.files import home, locked, read_or_set_aside, write_json_atomic
from specbench.common.identity import device_name, kernel_key, model_key, versions
from specbench.core.draft import Drafter

#: The parts of a stored profile that hold one entry per verify mode, drafter or context length.
_MERGED_PARTS = ("widths", "costs", "seconds", "overhead", "drafters", "lengths", "intervals", "noise")
#: What a profile holds per measured context length besides its ``offset``.
_LENGTH_PARTS = ("plain_step_s", "costs", "seconds")


@dataclass(frozen=True)
class Measurement:
    """How a cost model was measured (``specbench.cost.model``): seconds it took, the load average before and after,
    its protocol, how many measurements were pooled and the modes the last measured again."""

    seconds: float = 0.0
    load_before: float | None = None
    load_after: float | None = None
    protocol: dict[str, Any] | None = None
    measurements: int = 1
    again: list[str] = field(default_factory=list)


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
    #: What the kernels depended on when measured (``kernel_key``); "" for profiles stored before it was kept.
    kernels: str = field(default_factory=kernel_key)
    #: context length (as text: a JSON key) -> {"plain_step_s", "costs", "seconds"} measured with that many
    #: tokens in the cache, for some of the verify modes (widths as ``widths``; the overhead is the one
    #: measured at ``offset``).
    lengths: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The component stack (``specbench.cost.components.measure_components`` rows), when measured.
    components: list[dict[str, Any]] = field(default_factory=list)
    #: The file this profile was read from ("" when measured or built in memory): errors of planning with it
    #: name it. Not stored.
    source: str = field(default="", compare=False, repr=False)
    #: The timing rounds c(w) comes from, at ``offset``: "plain" -> seconds per plain step of each round; mode ->
    #: per width, that width's seconds in each round (empty for profiles stored before rounds were kept).
    rounds: dict[str, list[Any]] = field(default_factory=dict)
    #: mode -> per width, the interval [low, high] of c(w) over the rounds (``median_interval``), at
    #: ``interval_level``.
    intervals: dict[str, list[list[float]]] = field(default_factory=dict)
    interval_level: float = 0.0
    #: Why c(w) cannot be taken at face value (``noise``), per mode; empty: no sign of noise.
    noise: dict[str, list[str]] = field(default_factory=dict)
    #: How it was measured as the cost model (None: by ``measure`` or ``quick_profile`` alone).
    measured: Measurement | None = None

    @property
    def noisy(self) -> bool:
        return any(self.noise.values())

    def interval(self, w: int, mode: str = "fast") -> tuple[float, float] | None:
        """The interval of c(w) over the timing rounds at a measured width (None where none was kept)."""
        if mode not in self.intervals or w not in self.widths.get(mode, []):
            return None
        low, high = self.intervals[mode][self.widths[mode].index(w)]
        return float(low), float(high)

    @property
    def context_lengths(self) -> list[int]:
        """The context lengths this profile holds costs for (its ``offset`` and ``lengths``)."""
        return sorted({int(self.offset), *(int(n) for n in self.lengths)})

    def nearest_length(self, length: int) -> int:
        """The measured context length nearest ``length`` on a log scale (the longer one on a tie)."""
        return min(self.context_lengths, key=lambda n: (abs(np.log(max(n, 1) / max(length, 1))), -n))

    def at_length(self, length: int) -> Profile:
        """This profile with the costs measured at the context length nearest ``length`` (itself when that is
        its ``offset``): what break-even math at ``length`` plans with."""
        nearest = self.nearest_length(length)
        if nearest == self.offset:
            return self
        entry = self.lengths[str(nearest)]
        widths = {mode: self.widths[mode] for mode in entry["costs"]}
        return replace(self, offset=nearest, lengths={}, widths=widths, **{part: entry[part] for part in _LENGTH_PARTS})

    def c(self, w: int | float, mode: str = "fast", overhead: bool = True) -> float:
        """Cost of a width-w verification step in plain steps (see ``curve``)."""
        return cost_at(self.curve(mode, overhead), w)

    def curve(self, mode: str = "fast", overhead: bool = True) -> np.ndarray:
        """c(1..W) as an array (index w-1), unmeasured widths interpolated; with ``overhead`` the
        engine's per-step overhead is added (what a speculative step costs end to end)."""
        if mode not in self.costs:
            stored = f" stored in {self.source}" if self.source else ""
            raise ValueError(
                f"the profile of {self.name} on {self.device}{stored} has no {mode!r} verify costs "
                f"(it has {', '.join(self.costs) or 'none'}): measure it with verify=({mode!r},)"
            )
        widths = self.widths[mode]
        curve = np.interp(np.arange(1, max(widths) + 1), widths, self.costs[mode])
        return curve + (self.overhead.get(mode, 0.0) if overhead else 0.0)

    def drafter_cost(self, drafter: Drafter | str) -> float | None:
        """The measured d of a drafter (or drafter name), or None when this profile has none."""
        name = drafter if isinstance(drafter, str) else getattr(drafter, "name", None)
        entry = self.drafters.get(name) if name else None
        return None if entry is None else float(entry["d"])

    def path(self, root: Path | None = None) -> Path:
        return profile_path(self.model, self.device, self.versions, root, self.kernels)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "source"}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        names = set(cls.__dataclass_fields__)
        made = cls(**{"kernels": "", **{k: v for k, v in data.items() if k in names}})
        if isinstance(made.measured, dict):
            made.measured = Measurement(**made.measured) if made.measured else None
        return made

    def to_polars(self):
        """One row per (context length, mode, width): c and seconds, plus the profile's key columns."""
        import polars as pl

        return pl.DataFrame(
            [
                {
                    "model": self.model,
                    "name": self.name,
                    "device": self.device,
                    "mlx": self.versions.get("mlx"),
                    "mlx_lm": self.versions.get("mlx_lm"),
                    "mode": mode,
                    "width": w,
                    "c": c,
                    "seconds": s,
                    "overhead": self.overhead.get(mode, 0.0),
                    "plain_step_s": at.plain_step_s,
                    "offset": at.offset,
                    "created": self.created,
                    "kernels": self.kernels,
                }
                for at in map(self.at_length, self.context_lengths)
                for mode, costs in at.costs.items()
                for w, c, s in zip(at.widths[mode], costs, at.seconds[mode])
            ]
        )


def cost_at(costs: Any, w: int | float) -> float:
    """c(w) from c(1..W) (index w-1): linear between widths; past W, extended at the mean slope
    of c over 1..W, or flat where noise made that slope negative (a wider verification costs no less)."""
    c = np.asarray(costs, dtype=float)
    if w < 1:
        raise ValueError(f"width must be >= 1, got {w}")
    if w <= len(c):
        return float(np.interp(w, np.arange(1, len(c) + 1), c))
    if len(c) == 1:
        return float(c[0] * w)
    return float(c[-1] + max(0.0, (c[-1] - c[0]) / (len(c) - 1)) * (w - len(c)))


#: The level an interval aims at; with few rounds the widest interval (the range) may reach less (``level``).
LEVEL = 0.95


def _binomial_tail(n: int, j: int) -> float:
    """P(B <= j) for B ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(j + 1)) / 2**n


def level(rounds: int) -> float:
    """The coverage of ``median_interval`` over ``rounds`` rounds: the most that reaches ``LEVEL`` no higher than
    needed, or the range's coverage (1 - 2 / 2^n) where no interval reaches it (0 under 2 rounds)."""
    if rounds < 2:
        return 0.0
    return 1.0 - 2.0 * _binomial_tail(rounds, _order(rounds) - 1)


def _order(rounds: int) -> int:
    """The 1-based order statistic j of the interval [x_(j), x_(n+1-j)]: the largest j whose coverage is >= LEVEL,
    else 1 (the range)."""
    j = 1
    while j + 1 <= rounds // 2 and 1.0 - 2.0 * _binomial_tail(rounds, j) >= LEVEL:
        j += 1
    return j


def median_interval(values: Sequence[float]) -> tuple[float, float]:
    """The distribution-free interval of the median of ``values`` (order statistics) at ``level(len(values))``:
    the range for fewer than 9 values; one value gives a point."""
    if not values:
        raise ValueError("an interval needs at least one value")
    ordered = sorted(float(v) for v in values)
    j = _order(len(ordered))
    return ordered[j - 1], ordered[len(ordered) - j]


def noise(
    widths: Sequence[int], costs: Sequence[float], intervals: Sequence[Sequence[float]], overhead: float = 0.0
) -> list[str]:
    """Why a profile's c(w) of one verify mode cannot be taken at face value, one sentence each: a speculative step
    above width 1 (its forward and the engine's ``overhead``, as a step pays them) cheaper than one plain step, or a
    wider verification cheaper than a narrower one beyond both intervals (a kernel that changes with the rows can
    make that real: measured again, it holds). Empty: no sign of noise."""
    reasons = []
    for w, c, (low, high) in zip(widths, costs, intervals):
        if w > 1 and c + overhead < 1.0:
            reasons.append(
                f"c({w}) = {c + overhead:.3g} is below 1 [{low + overhead:.3g}-{high + overhead:.3g}]: "
                f"a {w}-row speculative step cheaper than a plain step"
            )
    for (w0, c0, (low0, _)), (w1, c1, (_, high1)) in zip(
        zip(widths, costs, intervals), list(zip(widths, costs, intervals))[1:]
    ):
        if high1 < low0:
            reasons.append(f"c({w1}) = {c1:.3g} steps down from c({w0}) = {c0:.3g} beyond both intervals")
    return reasons


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()


def profile_path(
    model: str, device: str, vers: dict[str, str], root: Path | None = None, kernels: str | None = None
) -> Path:
    """Where the profile of ``model`` (a ``model_key``) on ``device`` with these versions is stored;
    ``kernels`` (default: this process's ``kernel_key()``) adds ``--k`` and a digest of what else the kernels
    depend on (the BLAS library), so that a profile taken under another one is not reused ("": none, as
    profiles stored before it was kept)."""
    kernels = kernel_key() if kernels is None else kernels
    tag = f"--k{hashlib.sha1(kernels.encode()).hexdigest()[:8]}" if kernels else ""
    name = f"{_slug(model)}--{_slug(device)}--mlx{vers.get('mlx')}--mlxlm{vers.get('mlx_lm')}{tag}"
    return (root or home()) / "profiles" / f"{name}.json"


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x))


def check_profile(data: Any) -> Profile:
    """The profile in ``data`` (a stored profile's JSON), or a ValueError saying what is wrong with it: the
    one check of every reader. At ``offset`` and at each context length, each mode's widths are increasing
    integers >= 1 with as many costs and seconds, all finite and above zero, the plain step a time above zero;
    overheads are finite numbers and drafter costs finite and >= 0."""
    if not isinstance(data, dict):
        raise ValueError(f"a JSON object was expected, not {type(data).__name__}")
    try:
        profile = Profile.from_dict({k: v for k, v in data.items() if k != "source"})  # where it was read: not its own
    except TypeError as err:
        raise ValueError(str(err)) from None
    for part in ("widths", "costs", "seconds", "overhead", "drafters", "versions", "lengths"):
        if not isinstance(getattr(profile, part), dict):
            raise ValueError(f"{part!r} is not a JSON object")
    if not profile.costs:
        raise ValueError("it holds no verify costs")
    if not all(_number(v) for v in profile.overhead.values()):
        raise ValueError(f"the overheads {profile.overhead} are not all finite numbers")
    _check_costs(profile)
    for name, entry in profile.drafters.items():
        if not (isinstance(entry, dict) and _number(d := entry.get("d")) and d >= 0):
            raise ValueError(f"drafter {name!r} has no finite cost per draft token >= 0")
    if not (isinstance(profile.offset, int) and not isinstance(profile.offset, bool) and profile.offset >= 0):
        raise ValueError(f"offset {profile.offset!r} is not an integer >= 0")
    for length, entry in profile.lengths.items():  # every key first: pricing one length reads them all
        if not (isinstance(length, str) and length.isdigit() and int(length) >= 1 and isinstance(entry, dict)):
            raise ValueError(f"context length {length!r} is not an integer >= 1 with its costs")
    for length, entry in profile.lengths.items():
        costs, seconds = entry.get("costs"), entry.get("seconds")
        if not (isinstance(costs, dict) and isinstance(seconds, dict) and costs and costs.keys() == seconds.keys()):
            raise ValueError(f"context length {length}: its costs and seconds are not for the same verify modes")
        if set(costs) - set(profile.costs) or "plain_step_s" not in entry:
            raise ValueError(f"context length {length}: not all of plain_step_s and costs of {sorted(profile.costs)}")
        _check_costs(profile.at_length(int(length)), f"context length {length}: ")
    _check_components(profile.components)
    return profile


def _check_costs(profile: Profile, where: str = "") -> None:
    """Each mode's widths, costs and seconds, the overhead added, and the plain step of ``profile`` at its offset."""
    for mode, costs in profile.costs.items():
        curves = {f"the {mode!r} costs": costs, f"the {mode!r} seconds": profile.seconds.get(mode)}
        check_curves(profile.widths.get(mode), curves, f"the {mode!r} widths", where)
        overhead = profile.overhead.get(mode, 0.0)
        if min(costs) + overhead <= 0:
            raise ValueError(f"{where}the {mode!r} overhead {overhead} makes a verification cost nothing or less")
    if not (_number(profile.plain_step_s) and profile.plain_step_s > 0):
        raise ValueError(f"{where}plain_step_s is {profile.plain_step_s!r}, not a time above zero")


def check_curves(xs: Any, curves: dict[str, Any], what: str, where: str = "") -> None:
    """``xs`` (``what``: e.g. "the node counts") increasing integers >= 1, and each of ``curves`` (name -> values) as
    many finite numbers above zero; a ValueError saying which is not (prefixed with ``where``)."""
    if not (isinstance(xs, list) and xs and all(isinstance(x, int) and not isinstance(x, bool) for x in xs)):
        raise ValueError(f"{where}{what} {xs!r} are not a non-empty list of integers")
    if xs[0] < 1 or any(b <= a for a, b in zip(xs, xs[1:])):
        raise ValueError(f"{where}{what} {xs} are not in increasing order (integers >= 1)")
    for name, values in curves.items():
        if not (isinstance(values, list) and len(values) == len(xs)):
            raise ValueError(f"{where}{name} do not hold one value per one of {what}")
        if not all(_number(x) and x > 0 for x in values):
            raise ValueError(f"{where}{name} are not all finite numbers above zero")


def _check_components(rows: Any) -> None:
    """A component stack: rows with a width >= 1, a part's name and finite seconds >= 0."""
    if not isinstance(rows, list):
        raise ValueError("'components' is not a JSON list")
    for row in rows:
        ok = isinstance(row, dict) and isinstance(row.get("part"), str)
        ok = ok and isinstance(width := row.get("width"), int) and width >= 1
        if not (ok and _number(seconds := row.get("seconds")) and seconds >= 0 and _number(row.get("step_s"))):
            raise ValueError(f"a component row {row!r} lacks a width >= 1, a part, or finite seconds")


def read_profile(path: str | os.PathLike) -> Profile:
    """A cost profile from a JSON file (as ``save_profile`` stores it; its ``source``), with the checks every
    reader applies (``check_profile``): a FileNotFoundError or a ValueError naming the file otherwise."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no cost profile at {path}: give a profile's JSON (under $SPECBENCH_HOME/profiles)")
    try:
        profile = check_profile(json.loads(path.read_text(encoding="utf-8")))
    except ValueError as err:
        raise ValueError(f"the stored cost profile {path} is damaged ({err})") from err
    profile.source = str(path)
    return profile


def save_profile(profile: Profile, root: Path | None = None) -> Path:
    """Write a profile atomically, keeping modes and drafters an earlier profile of the same key has
    and this one lacks (a damaged earlier file is moved aside): read, merged and written under the
    file's lock, so that concurrent writers of different modes lose none."""
    path = profile.path(root)
    with locked(path):
        old = read_or_set_aside(path, read_profile, "cost profile")
        if old is not None:
            merged: dict[str, Any] = {part: {**getattr(old, part), **getattr(profile, part)} for part in _MERGED_PARTS}
            profile = replace(profile, **merged, components=profile.components or old.components)
            # lengths measured in other modes or widths than those now kept are dropped
            profile.lengths = {n: e for n, e in profile.lengths.items() if _fits(e, profile.costs, profile.widths)}
        return write_json_atomic(path, profile.to_dict())


def _fits(entry: dict[str, Any], costs: dict[str, list[float]], widths: dict[str, list[int]]) -> bool:
    """Whether a context length's costs are for some of these modes, at their widths."""
    return set(entry["costs"]) <= set(costs) and all(len(v) == len(widths[m]) for m, v in entry["costs"].items())


def load_profile(model: nn.Module | str, device: str | None = None, root: Path | None = None) -> Profile | None:
    """The stored profile of ``model`` (a model or its ``model_key``) on this device, these library
    versions and this BLAS library, or None. A damaged file is moved aside with a warning naming it
    (``specbench.common.files.DamagedFileWarning``) and None returned, so that it is measured anew."""
    key = model if isinstance(model, str) else model_key(model)
    return read_or_set_aside(profile_path(key, device or device_name(), versions(), root), read_profile, "cost profile")
