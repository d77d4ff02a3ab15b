"""Calibration: per width, the cheapest exact level on this device.

Which split is needed depends on dtype, width and device, so ``calibrate`` tests the levels
against serial steps on the device and keeps, per width, the cheapest that is bit-identical;
``calibrated_plans(model)`` (what ``exact_mode(model)`` uses) looks the table up, calibrating a
width the first time it is asked for, and the table is stored under ``$SPECBENCH_HOME/exact``,
keyed by everything the kernels depend on (``calibration_key``: on CUDA the driver, CUDA runtime and cuDNN
this process runs too); a damaged stored table is moved aside with a warning naming it and calibrated anew.

Which kernel a device runs can change with the number of keys attended (cuDNN's decoding attention from 256
keys on a buffer of 256-row steps, MLX's vector kernels' passes over longer rows), so a width's level holds
only up to the longest cache length it was probed at (``WidthCalibration.reach``): a generation calibrates the
lengths its context reaches first (``lengths_for``), and a verification past a width's reach runs serially.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import switch_layers
from mlx_lm.models.cache import KVCache, make_prompt_cache

from specbench import kernels
from specbench.common import distributed
from specbench.common.files import home, locked, set_aside, write_json_atomic
from specbench.common.identity import cuda_libraries, device_name, kernel_key, model_key, versions
from specbench.core.forward import context_length, prefill, vocab_size
from specbench.exact.hooks import split_mode
from specbench.exact.layout import cudnn_attention, layout_sensitive_attention, serial_extent, with_extent
from specbench.exact.one_row import FASTER_BY, own_layers
from specbench.exact.plan import ExactPlan

#: Cache lengths calibration probes, up to the context a generation reaches: short; crossing mlx-lm's first KV
#: buffer step (256 keys, where cuDNN's decoding attention starts); then the lengths where attention kernels
#: switch to more passes or blocks over the keys, up to 32k.
CACHE_LENGTHS = (32, 255, 1024, 4096, 8192, 16384, 32768)
#: The context ``calibrate`` covers when not told another (a ``KVCache`` step).
DEFAULT_CONTEXT = 256


def lengths_for(context: int, limit: int | None = None, lengths: Sequence[int] = CACHE_LENGTHS) -> list[int]:
    """The cache lengths a generation reaching ``context`` tokens is calibrated at: every one of ``lengths`` below
    it, and the last length before the KV step at or past it (``context`` rounded up to mlx-lm's 256-row buffer
    step, less one: a verification there crosses the step, as one at 255 does); none at or past the model's
    ``limit`` (its context length)."""
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ValueError(f"a context to calibrate for is an integer >= 1 (tokens), got {context!r}")
    step = KVCache.step
    top = step * -(-context // step) - 1
    found = sorted({*(n for n in lengths if n < context), top})
    if limit is not None:
        found = [n for n in found if n < limit] or [min(found[0], max(limit - 1, 1))]
    return found


@dataclass
class WidthCalibration:
    """What was tested at one width: each level's exactness (and seconds), the pick, and the cache lengths it was
    probed at (the pick is exact at every one of them)."""

    width: int
    level: str
    tests: list[dict[str, Any]] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)

    @property
    def reach(self) -> int:
        """The longest cache length probed: a verification at a longer cache is past what was calibrated."""
        return max(self.lengths, default=0)

    def covers(self, lengths: Sequence[int]) -> bool:
        return set(lengths) <= set(self.lengths)

    @property
    def fast_level(self) -> str:
        """The level a fast verification of this width runs at: the exact level where calibration timed it at most
        ``FASTER_BY`` of MLX's batched forward ("none", timed where the kernels were tried), else "none"."""
        seconds = {t["level"]: t.get("seconds") for t in self.tests if t.get("exact") or t["level"] == "none"}
        batched, exact = seconds.get("none"), seconds.get(self.level)
        cheaper = batched is not None and exact is not None and exact <= FASTER_BY * batched
        return self.level if cheaper else "none"


@dataclass
class Calibration:
    """The cheapest exact level per width for one model shape on one device and MLX version."""

    key: str
    device: str
    versions: dict[str, str]
    widths: dict[int, WidthCalibration] = field(default_factory=dict)

    def level_for(self, width: int) -> str:
        """The chosen level at ``width`` ("none" at width 1; KeyError if not calibrated)."""
        if width <= 1:
            return "none"
        return self.widths[width].level

    def rows(self) -> list[dict[str, Any]]:
        """One flat record per (width, tested level): for tables and CSV."""
        return [{"width": w, "chosen": c.level, **test} for w, c in sorted(self.widths.items()) for test in c.tests]

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "device": self.device,
            "versions": self.versions,
            "widths": {
                str(w): {"level": c.level, "tests": c.tests, "lengths": c.lengths}
                for w, c in sorted(self.widths.items())
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Calibration:
        widths = {
            int(w): WidthCalibration(
                int(w), c["level"], list(c.get("tests", [])), [int(n) for n in c.get("lengths", [])]
            )
            for w, c in data.get("widths", {}).items()
        }
        return cls(data["key"], data["device"], dict(data.get("versions", {})), widths)


#: Bumped when calibration tests more conditions (or is keyed by more), so that stored tables from
#: before are not reused. 4: keyed by the BLAS library too. 5: linear chunks also tried compiled.
#: 6: quantized linear layers also tried through the row-invariant kernel (``linear/kernel``).
#: 7: unquantized linear layers through the kernel too (``gemv_rows``).
#: 8: attention also tried through the row-invariant attention kernel (``attention/kernel``).
#: 9: probed at several cache lengths (``lengths_for``), each width's lengths stored; keyed by CUDA's libraries.
#: 10: the batched forward ("none") timed too where the kernels are tried (``WidthCalibration.fast_level``), and
#: where it is exact, the linear layers through the kernels tried against it.
CALIBRATION_METHOD = 10
#: Calibrations of this process, by key.
_calibrations: dict[str, Calibration] = {}
_keys: dict[tuple[int, Any], tuple[weakref.ref, str]] = {}  # by model and its shard group


def calibration_key(model: nn.Module) -> str:
    """Model shape (every parameter's name, shape and dtype) and what the kernels depend on: device, MLX / mlx-lm
    versions, the BLAS on the CPU (``kernel_key``), on CUDA the driver, runtime and cuDNN this process runs
    (``cuda_libraries``), cuDNN's attention and, on a GPU, specbench's kernel sources."""
    memo = _keys.get((id(model), distributed.shard_group(model)))
    if memo is not None and memo[0]() is model:
        return memo[1]
    shape = model_key(model)
    on_gpu = kernels.cuda_available() or kernels.metal_available()
    own = f"|kernels {kernels.source_digest()}" if on_gpu else ""  # where kernels can run: their sources
    cuda = "".join(f"|{name} {value}" for name, value in sorted(cuda_libraries().items()))
    attention = "|cudnn attention" if cudnn_attention() else ""
    text = f"{shape}|{kernel_key()}{cuda}{attention}{own}|method {CALIBRATION_METHOD}"
    key = f"{shape}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"
    _keys[(id(model), distributed.shard_group(model))] = (weakref.ref(model), key)
    return key


def calibration_dir() -> Path:
    return home() / "exact"


def _calibration_path(key: str) -> Path:
    return calibration_dir() / f"{key}.json"


def _read(path: Path, key: str) -> Calibration | None:
    """The calibration stored at ``path`` for ``key``: None when there is none, or when it cannot be read or was
    made for another key (another model shape, device, driver or library: a foreign file copied in); then it is
    moved aside with one warning naming it, and calibrated anew."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise TypeError(f"a JSON object was expected, not {type(data).__name__}")
        calibration = Calibration.from_json(data)
        for width in calibration.widths.values():
            ExactPlan.parse(width.level)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        set_aside(path, "exact-mode calibration", f"{type(err).__name__}: {err}")
        return None
    if calibration.key != key:
        made = f"made for {calibration.key} on {calibration.device}, not for {key} on {device_name()}"
        set_aside(path, "exact-mode calibration", made, problem="foreign")
        return None
    return calibration


def load_calibration(model: nn.Module) -> Calibration | None:
    """The calibration of ``model`` on this device, from memory or disk (None when there is none)."""
    key = calibration_key(model)
    if key in _calibrations:
        return _calibrations[key]
    calibration = distributed.agreed(_read(_calibration_path(key), key), model)  # a sharded model: rank 0's
    if calibration is not None:
        _calibrations[key] = calibration
    return calibration


def _save(calibration: Calibration) -> None:
    """Write ``calibration`` atomically, merged with the widths another process or thread stored
    meanwhile: the read, merge and write happen under a lock file, so no writer loses another's widths."""
    path = _calibration_path(calibration.key)
    with locked(path):
        stored = _read(path, calibration.key)
        if stored is not None:
            for width, found in stored.widths.items():
                calibration.widths.setdefault(width, found)
        write_json_atomic(path, calibration.to_json())


class CalibratedPlans(dict):
    """Plans by width, parsed up front; a width missing is calibrated on its first use (at ``DEFAULT_CONTEXT``).
    Called with a width, the plan; ``covers(width, length)``: whether that width's level holds at a cache of
    ``length`` tokens (calibrated that far first where it was not)."""

    def __init__(self, model: nn.Module, stored: Calibration | None):
        super().__init__({w: ExactPlan.parse(c.level) for w, c in stored.widths.items()} if stored else {})
        self.reaches = {w: c.reach for w, c in stored.widths.items()} if stored else {}
        self.model = weakref.ref(model)
        self.calibrated = 0  # widths calibrated further by ``covers``

    def __missing__(self, width: int) -> ExactPlan:
        model = self.model()
        if model is None:
            raise ValueError("the model of this exact_mode was freed")
        found = calibrate(model, [width]).widths[width]
        self.reaches[width] = found.reach
        plan = self[width] = ExactPlan.parse(found.level)
        return plan

    def __call__(self, width: int) -> ExactPlan:
        return self[width]

    def covers(self, width: int, length: int) -> bool:
        """Whether ``width``'s level was probed at a cache of ``length`` tokens or longer, calibrating it as far
        first where not (``lengths_for(length + 1)``: once per model, device and range, stored); False where the
        model's context leaves no room to probe that far."""
        self[width]  # calibrated first where missing
        if self.reaches[width] >= length:
            return True
        model = self.model()
        if model is None:
            raise ValueError("the model of this exact_mode was freed")
        found = calibrate(model, [width], lengths=lengths_for(length + 1, context_length(model))).widths[width]
        self[width], self.reaches[width] = ExactPlan.parse(found.level), found.reach
        self.calibrated += 1
        return found.reach >= length


def calibrated_plans(model: nn.Module) -> CalibratedPlans:
    """The plan per width from ``model``'s calibration, read once; a width it lacks is calibrated when first used."""
    return CalibratedPlans(model, load_calibration(model))


# -- calibrating -----------------------------------------------------------------------------


def calibrate(
    model: nn.Module,
    widths: int | Sequence[int] = 16,
    lengths: Sequence[int] | None = None,
    measure: bool = True,
    repeats: int = 3,
    seed: int = 0,
    save: bool = True,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
    boundary: bool = True,
) -> Calibration:
    """Find, per width, the cheapest level whose forward is bit-identical to serial steps.

    For each width w (an int W means 2..W) a cache of random tokens at each of ``lengths`` (default
    ``lengths_for(DEFAULT_CONTEXT)``; lengths past the model's context for w more rows left out) is extended by w
    random tokens, once by w single-token steps (the reference) and once per tested level, logits compared bit for
    bit; with ``boundary``, also at a cache whose verification crosses the first KV buffer step, laid out as a
    speculative verification leaves it (on a GPU). A level is exact only where exact on every probe. Each op family
    is relaxed alone (the others split row by row), the cheapest exact scheme of each (by median seconds of
    ``repeats`` forwards when ``measure``, else the first exact one) combined and checked; "serial" is the
    fallback, and timed against a pick through the kernels; a pick in chunks is also tried ``mx.compile``d.
    Results merge into the model's stored calibration (on disk after each width unless ``save`` is False); widths
    it already holds at these lengths are kept unless ``force``.
    """
    ws = list(range(2, widths + 1)) if isinstance(widths, int) else sorted({int(w) for w in widths})
    if not ws or ws[0] < 1:
        raise ValueError(f"widths must be an int W >= 2 (for 2..W) or widths >= 1, got {widths!r}")
    wanted = _fitting(model, lengths, max(ws))
    key = calibration_key(model)
    calibration = load_calibration(model) or Calibration(key, device_name(), {**versions(), **cuda_libraries()})
    old = calibration.widths
    ws = [w for w in ws if w > 1 and (force or w not in old or not old[w].covers(wanted))]
    if not ws:
        return calibration
    # a width calibrated before keeps its lengths: its new level holds at all of them
    probed = sorted({*wanted, *(n for w in ws if w in old and not force for n in old[w].lengths)})
    moe = _has_experts(model)
    kernel = uses_kernel(model)
    attention_kernel = uses_attention_kernel(model)
    rng = np.random.default_rng(seed)
    with own_layers(model):  # against MLX's own products, also where a generation's one-row kernels are in place
        with split_mode(model, "none"):  # plain forwards, even inside an open exact mode
            probes = _Probe.at(model, probed, max(ws), rng)
            # The CPU's kernels read exactly the keys they attend; a GPU's may not (cuDNN's do not).
            on_gpu = mx.default_device().type == mx.DeviceType.gpu
            layout = boundary and (on_gpu or layout_sensitive_attention())
            crossing = _boundary_offset(model, max(ws)) if layout else None
            if crossing is not None:
                # The layout a verification that crossed the step two tokens earlier leaves.
                probes.append(_Probe(model, crossing, max(ws), rng, extent=crossing - 2 + KVCache.step))
        probe = _Probes(probes, distributed.is_sharded(model))
        for i, w in enumerate(ws, 1):
            t0 = time.perf_counter()
            calibration.widths[w] = _calibrate_width(probe, w, moe, measure, repeats, kernel, attention_kernel)
            calibration.widths[w].lengths = list(probed)
            if save:  # width by width: a run stopped midway keeps the widths it finished (rank 0 writes its levels)
                _save(calibration)
            if progress is not None:
                level, seconds = calibration.widths[w].level, time.perf_counter() - t0
                progress(f"exact calibration {i}/{len(ws)}: width {w} runs {level} ({seconds:.1f} s)")
    # The ranks of a sharded model run rank 0's levels (picked by its clock): the same forwards and collectives.
    calibration.widths.update(distributed.agreed({w: calibration.widths[w] for w in ws}, model))
    _calibrations[key] = calibration
    return calibration


def calibrate_over_ranks(
    model: nn.Module,
    widths: Sequence[int],
    lengths: Sequence[int],
    progress: Callable[[str], None] | None = None,
) -> Calibration:
    """``calibrate(model, widths, lengths)`` with the widths still uncovered (rank 0's store decides) spread over the
    ranks of a launch (each a share of about equal cost: a width costs about its width), every rank then holding
    every rank's levels, in memory and in its store; ``calibrate`` itself in a world of one or for a sharded model
    (whose ranks calibrate together)."""
    if distributed.size() == 1 or distributed.is_sharded(model):
        return calibrate(model, list(widths), lengths=lengths, progress=progress)
    ws = distributed.broadcast(uncovered(model, widths, lengths))
    mine = [ws[i] for i in distributed.my_share([float(w) for w in ws])]
    found = calibrate(model, mine, lengths=lengths, progress=progress).to_json()["widths"] if mine else {}
    shares = distributed.gather_outcomes(lambda: {str(w): found[str(w)] for w in mine})
    if not ws:
        return load_calibration(model) or calibrate(model, list(widths), lengths=lengths, progress=progress)
    key = calibration_key(model)
    calibration = load_calibration(model) or Calibration(key, device_name(), {**versions(), **cuda_libraries()})
    for share in shares:
        calibration.widths.update(Calibration.from_json({"key": key, "device": "", "widths": share}).widths)
    _calibrations[key] = calibration
    _save(calibration)
    return calibration


def _fitting(model: nn.Module, lengths: Sequence[int] | None, widest: int) -> list[int]:
    """``lengths`` (default ``lengths_for(DEFAULT_CONTEXT)``) checked, sorted, without those whose verification of
    ``widest`` rows would not fit in the model's context (the shortest kept where none would)."""
    limit = context_length(model)
    wanted = lengths_for(DEFAULT_CONTEXT, limit) if lengths is None else sorted({*lengths})
    if not wanted or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in wanted):
        raise ValueError(f"lengths must be cache lengths (integers >= 1), got {lengths!r}")
    return [n for n in wanted if limit is None or n + widest <= limit] or [min(wanted)]


def uncovered(model: nn.Module, widths: Sequence[int], lengths: Sequence[int] | None = None) -> list[int]:
    """The ``widths`` (>= 2) ``calibrate(model, widths, lengths)`` would calibrate: not calibrated yet, or not at
    every one of ``lengths``."""
    ws = sorted({int(w) for w in widths if w > 1})
    if not ws:
        return []
    wanted = _fitting(model, lengths, max(ws))
    stored = load_calibration(model)
    return [w for w in ws if stored is None or w not in stored.widths or not stored.widths[w].covers(wanted)]


def uses_kernel(model: nn.Module) -> bool:
    """Whether calibration tries ``linear/kernel`` for ``model``: on CUDA, for a model with linear layers,
    quantized (``qmv_rows``) or not (``gemv_rows``); on Metal, with quantized ones (``qmv_rows`` only); a kernel
    is then used only where the probe finds it bit-identical."""
    quantized = (nn.QuantizedLinear, nn.QuantizedEmbedding)
    layers = (*quantized, nn.Linear) if kernels.cuda_available() else quantized if kernels.metal_available() else ()
    return bool(layers) and any(isinstance(m, layers) for _, m in model.named_modules())


def uses_attention_kernel(model: nn.Module) -> bool:
    """Whether calibration tries ``attention/kernel``: on CUDA with MLX's own attention (cuDNN's off), where the probe
    proved ``attention_rows`` for each attention layer's dtype and head dimension (``k_proj``, ``n_kv_heads``)."""
    if not kernels.cuda_available() or cudnn_attention():
        return False
    shapes = set()
    for _, m in model.named_modules():
        if isinstance(p := getattr(m, "k_proj", None), nn.Module) and isinstance(getattr(m, "n_kv_heads", None), int):
            shapes.add((p["scales" if "scales" in p else "weight"].dtype, p["weight"].shape[0] // m.n_kv_heads))
    return bool(shapes) and all(kernels.attention_variant(dtype, head_dim) is not None for dtype, head_dim in shapes)


def _has_experts(model: nn.Module) -> bool:
    return any(isinstance(m, (switch_layers.SwitchGLU, switch_layers.SwitchMLP)) for _, m in model.named_modules())


def chunk_sizes(width: int) -> list[int]:
    """Rows per linear call to try at ``width``, most first: fewer, wider calls cost less, and the
    first that is exact is the widest the device's kernels keep row-invariant at this width."""
    return list(range(width - 1, 1, -1))


def _candidates(width: int, moe: bool, kernel: bool = False, attention_kernel: bool = False) -> list[list[str]]:
    """Levels to test at ``width``, in groups: each group relaxes one op family of the full
    split to cheaper schemes (the other families stay split row by row); ``kernel``: the linear
    layers through the row-invariant kernel first; ``attention_kernel``: attention through its
    row-invariant kernel too."""
    kernel_levels = ["attention+linear/kernel"] if kernel else []
    linear = [*kernel_levels, "attention+linear/vector", *[f"attention+linear/{c}" for c in chunk_sizes(width)]]
    experts = "+experts" if moe else ""
    attention_levels = [f"attention/kernel+linear{experts}", f"attention+linear{experts}"] if attention_kernel else []
    groups = [
        ["none"],
        [f"linear{experts}", *attention_levels],  # attention batched (or the kernel against the split)
        [level + experts for level in ["attention", *linear]],  # linear relaxed
    ]
    if moe:
        groups.append(["attention+linear", "attention+linear+experts/unsorted"])  # experts relaxed
    groups.append([f"attention+linear{experts}"])  # the full split
    return groups


def _combine(picks: dict[str, str], moe: bool) -> str:
    """Merge each family's cheapest exact scheme into one level."""
    parts = []
    attention = picks.get("attention", "split")
    if attention != "batched":
        parts.append("attention/kernel" if attention == "kernel" else "attention")
    if picks.get("linear") != "batched":
        parts.append(picks.get("linear", "linear"))
    if moe and picks.get("experts") != "batched":
        parts.append(picks.get("experts", "experts"))
    return ExactPlan.parse("+".join(parts) or "none").name


def _calibrate_width(
    probe: _Probes,
    width: int,
    moe: bool,
    measure: bool,
    repeats: int,
    kernel: bool = False,
    attention_kernel: bool = False,
) -> WidthCalibration:
    tests: list[dict[str, Any]] = []

    def test(level: str, timed: bool = True) -> bool:
        plan = ExactPlan.parse(level)
        level = plan.name
        try:
            exact, _ = probe.run(level, width)  # also the warm-up
        except Exception as err:  # a kernel that does not compile or run: a recorded fallback, not an error
            used = ("linear/kernel",) * (plan.linear == "kernel") + ("attention_rows",) * (plan.attention == "kernel")
            if not used:
                raise
            kernels.warn_fallback(" and ".join(used), f"{type(err).__name__}: {err}")
            tests.append({"level": level, "exact": False, "seconds": None, "error": f"{type(err).__name__}: {err}"})
            return False
        # only exact levels are timed, and the batched forward ("none"), which fast mode weighs the exact level against
        seconds = probe.time(level, width, repeats) if (exact or level == "none") and measure and timed else None
        tests.append({"level": level, "exact": exact, "seconds": seconds})
        return exact

    # The batched forward, timed where the kernels are tried (fast mode takes the exact level where it is cheaper:
    # ``WidthCalibration.fast_level``). Where it is exact, only the linear kernels can be cheaper: MLX's products
    # below 8 rows read every weight once per row (on an H100, a width-3 forward of a dense 8B shape costs 1.8 plain
    # steps), the kernel once for all rows.
    if test("none", timed=kernel):
        if kernel and measure and test("linear/kernel") and tests[-1]["seconds"] <= FASTER_BY * tests[0]["seconds"]:
            return WidthCalibration(width, "linear/kernel", tests)
        return WidthCalibration(width, "none", tests)
    groups = _candidates(width, moe, kernel, attention_kernel)
    full = groups[-1][0]
    families = ["attention", "linear"] + (["experts"] if moe else [])
    picks: dict[str, str] = {}
    for family, group in zip(families, groups[1:-1]):
        best: tuple[float, str] | None = None
        chunked = False  # the widest exact chunk found: narrower ones only add calls
        for order, level in enumerate(group):
            if chunked and ExactPlan.parse(level).chunked:
                continue
            if best is not None and best[1] == "batched" and not ExactPlan.parse(level).uses_kernel:
                continue  # MLX's own calls in smaller pieces cost no less than the batched call that is exact
            if test(level):
                chunked = chunked or ExactPlan.parse(level).chunked
                cost = tests[-1]["seconds"] if measure else float(order)
                if best is None or cost < best[0]:
                    best = (cost, ExactPlan.parse(level).scheme(family))
                if not measure:
                    break
        if best is not None:
            picks[family] = best[1]
    options: list[tuple[float, str]] = []
    for level in dict.fromkeys([_combine(picks, moe), ExactPlan.parse(full).name]):
        tested = {t["level"]: t for t in tests}
        if level in tested:
            exact, seconds = tested[level]["exact"], tested[level]["seconds"]
        else:
            exact = test(level)
            seconds = tests[-1]["seconds"]
        if exact:
            options.append((seconds or 0.0, level))
            break
    if not options or (measure and ExactPlan.parse(options[0][1]).uses_kernel):
        # serial steps: the fallback, and timed against a pick through the kernels (a split through MLX's own calls
        # runs each op batched or in pieces of at least one row, where serial steps run every op one row at a time:
        # never dearer, as MLX's calls in smaller pieces cost no less)
        seconds = probe.time("serial", width, repeats) if measure else None
        tests.append({"level": "serial", "exact": True, "seconds": seconds})
        options.append((seconds if seconds is not None else float("inf"), "serial"))
    cost, level = min(options) if measure else options[0]
    if ExactPlan.parse(level).chunked:  # the same chunks through mx.compile: taken where exact and measured cheaper
        compiled = replace(ExactPlan.parse(level), compiled=True).name
        if test(compiled) and measure and tests[-1]["seconds"] < cost:
            level = compiled
    return WidthCalibration(width, level, tests)


# -- the probes ------------------------------------------------------------------------------


#: Tokens per forward of a probe's prefill (``prefill``: a 16k-token prefix in one forward ran an H100 out of memory).
PREFILL_CHUNK = 512


class _Probe:
    """A prefilled cache in a given KV layout, probe tokens and the serial reference logits.

    The reference is w single-token steps from a cache laid out as serial decoding lays it out;
    before each tested forward the cache gets the same contents back, with its KV buffers
    ``extent`` rows long (None: the serial layout; else e.g. the ``offset + 256`` rows a
    verification that crossed a buffer step leaves).
    """

    def __init__(
        self,
        model: nn.Module,
        offset: int,
        width: int,
        rng: np.random.Generator,
        extent: int | None = None,
        prefix: list[tuple[mx.array, mx.array]] | None = None,
    ):
        self.model = model
        self.offset = offset
        self.extent = extent
        vocab = vocab_size(model)
        if prefix is None:
            self.cache = prefill(model, rng.integers(0, vocab, size=offset).tolist(), PREFILL_CHUNK)
            self.saved = self._save_state()
        else:  # each layer's keys and values of ``offset`` tokens: another probe's first rows
            self.cache = make_prompt_cache(model)
            self.saved = [(mx.contiguous(k[..., :offset, :]), mx.contiguous(v[..., :offset, :])) for k, v in prefix]
            mx.eval(self.saved)
            self.restore(0)
        self.tokens = mx.array(rng.integers(0, vocab, size=width), dtype=mx.uint32)[None]
        reference = []
        for i in range(width):
            out = model(self.tokens[:, i : i + 1], cache=self.cache)
            mx.eval(out)
            reference.append(np.array(out[0, 0].astype(mx.float32)))
        self.reference = np.stack(reference)
        self.restore(width)

    @classmethod
    def at(cls, model: nn.Module, lengths: Sequence[int], width: int, rng: np.random.Generator) -> list[_Probe]:
        """Probes at each of ``lengths`` (increasing): where every cache is a KVCache, prefixes of one random prompt
        prefilled once, up to the longest (each shorter probe starts from the first rows of its keys and values),
        else each prefilled on its own."""
        longest = cls(model, lengths[-1], width, rng)
        if not all(type(c) is KVCache and isinstance(kv, tuple) for c, kv in zip(longest.cache, longest.saved)):
            return [cls(model, n, width, rng) for n in lengths[:-1]] + [longest]
        return [cls(model, n, width, rng, prefix=longest.saved) for n in lengths[:-1]] + [longest]

    def _save_state(self) -> list[Any]:
        saved: list[Any] = []
        for c in self.cache:
            if type(c) is KVCache and c.keys is not None:
                # Separate arrays: a cache update may write into its buffer in place.
                kv = (mx.contiguous(c.keys[..., : c.offset, :]), mx.contiguous(c.values[..., : c.offset, :]))
                mx.eval(kv)
                saved.append(kv)
            else:
                saved.append(None if c.is_trimmable() else _copy_state(c.state))
        return saved

    def restore(self, n: int) -> None:
        for c, saved in zip(self.cache, self.saved):
            if isinstance(saved, tuple) and type(c) is KVCache:
                extent = self.extent or serial_extent(self.offset, c.step)
                c.keys = with_extent(saved[0], self.offset, extent)
                c.values = with_extent(saved[1], self.offset, extent)
                c.offset = self.offset
            elif saved is None:
                c.trim(n)
            else:
                c.state = _copy_state(saved)
        mx.eval([c.state for c in self.cache])

    def run(self, level: str, width: int) -> tuple[bool, float]:
        """Whether ``level`` reproduces the serial logits at ``width``, and its seconds."""
        with split_mode(self.model, level):
            mx.synchronize()
            t0 = time.perf_counter()
            out = self.model(self.tokens[:, :width], cache=self.cache)
            mx.eval(out)
            seconds = time.perf_counter() - t0
        self.restore(width)
        got = np.array(out[0].astype(mx.float32))
        return bool(np.array_equal(got, self.reference[:width])), seconds


class _Probes:
    """Calibration probes: the first (serial layout) is timed; a level is exact when it
    reproduces the serial logits on all of them. On a sharded model every outcome is agreed by
    the ranks (exact only where exact on every rank; the slowest rank's seconds; a failure on any
    rank raised on all), so that every rank takes the same decisions and runs the same forwards,
    whose collectives then meet, however the ranks' clocks differ."""

    def __init__(self, probes: list[_Probe], sharded: bool = False):
        self.probes = probes
        self.sharded = sharded

    def run(self, level: str, width: int) -> tuple[bool, float]:
        def work() -> tuple[bool, float]:
            exact, seconds = self.probes[0].run(level, width)
            for probe in self.probes[1:]:
                exact = probe.run(level, width)[0] and exact
            return exact, seconds

        if not self.sharded:
            return work()
        outcomes = distributed.gather_outcomes(work)
        return all(exact for exact, _ in outcomes), max(seconds for _, seconds in outcomes)

    def time(self, level: str, width: int, repeats: int) -> float:
        seconds = statistics.median(self.probes[0].run(level, width)[1] for _ in range(repeats))
        return max(distributed.gather(seconds)) if self.sharded else seconds


def _boundary_offset(model: nn.Module, width: int) -> int | None:
    """An offset whose verifications (of any width >= 2) cross the first KV buffer step: row 0
    attends a full 256-row buffer, the later rows a longer one (None for models without a
    plain ``KVCache`` or with a shorter context)."""
    limit = context_length(model)
    if limit is not None and KVCache.step - 1 + width > limit:
        return None
    if not any(type(c) is KVCache for c in make_prompt_cache(model)):
        return None
    return KVCache.step - 1


def _copy_state(state: Any) -> Any:
    """A copy of a cache's state containers (arrays are immutable; lists are updated in place)."""
    if isinstance(state, (list, tuple)):
        return type(state)(_copy_state(x) for x in state)
    return state
