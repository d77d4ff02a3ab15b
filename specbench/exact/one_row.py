"""Plain decoding through the row-invariant kernels where they are faster at one row.

``qmv_rows`` and ``gemv_rows`` at one row compute MLX's own one-row product bit for bit (the device's
probe proves it before they are used at all), and on a GPU they can be faster than MLX's: on an H200,
a 12288 x 4096 4-bit layer took 27.0 us against MLX's 36.7, the 151936 x 4096 LM head 188 us against
349, while a 1024 x 4096 k/v projection took 13.4 against 9.5. So which layers gain is a property of the
layer's shape and the device, and whether it pays at all depends on what sets a decoding step's pace: a kernel
call costs more host time than MLX's product, and on a host-bound machine (an H200 decoding a 4-bit 8B model,
where building and launching a step's graph takes longer than running it) that loses more than the device
saves. So ``one_row_choice`` times each distinct layer shape of a model both ways on the device (and checks that
the kernel's one-row results on that shape equal MLX's bit for bit: the probe proves the kernel on small shapes),
then plain steps with the faster kernels against plain steps without, and keeps the kernels only where the steps
were faster and their logits bit-identical (the model's real activations, which random rows may not reach; once per
process); ``one_row_kernels`` runs the chosen layers' one-row calls through the kernel. The
output is the model's own greedy output either way: only the time changes.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten
from mlx_lm.models.cache import make_prompt_cache

from specbench import kernels
from specbench.common.distributed import is_sharded
from specbench.exact.kernel_calls import kernel_product
from specbench.kernels.bench import per_call_seconds

#: The kernel is chosen for a layer shape only where it takes at most this share of MLX's time at one row
#: (a margin over the timing's noise: a near tie keeps MLX's product).
FASTER_BY = 0.97

#: The layer classes whose one-row product a kernel computes (a tied embedding's ``as_linear`` included).
_LINEAR = (nn.Linear, nn.QuantizedLinear)
_EMBEDDING = (nn.Embedding, nn.QuantizedEmbedding)


@dataclass(frozen=True)
class ShapeTiming:
    """One layer shape's one-row product, timed both ways (device seconds per call); ``identical``: whether the
    kernel's one-row results on this very shape equal MLX's bit for bit (None: not checked)."""

    signature: tuple
    layers: int
    mlx_s: float
    kernel_s: float | None
    identical: bool | None = None

    @property
    def uses_kernel(self) -> bool:
        faster = self.kernel_s is not None and self.kernel_s <= FASTER_BY * self.mlx_s
        return faster and self.identical is not False


def signature(layer: nn.Module) -> tuple:
    """What a layer's one-row product cost depends on: its class, output and input features, quantization."""
    weight = layer["weight"]
    bits = getattr(layer, "bits", None)
    features = weight.shape[-1] * 32 // bits if bits else weight.shape[-1]
    scales = layer["scales"] if "scales" in layer else weight
    return (type(layer).__name__, weight.shape[0], features, bits, getattr(layer, "group_size", None), scales.dtype)


def _candidates(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(path, layer) of every layer a one-row kernel could compute; embeddings only where tied as the output head."""
    lm = getattr(model, "language_model", model)
    tied = getattr(lm, "lm_head", None) is None
    found = []
    for path, module in model.named_modules():
        if type(module) in _LINEAR or (tied and type(module) in _EMBEDDING and path.endswith("embed_tokens")):
            found.append((path, module))
    return found


def _one_row_call(layer: nn.Module) -> Callable[[mx.array], mx.array]:
    return layer.as_linear if type(layer) in _EMBEDDING else layer


#: Timings per (device, signature), measured once per process.
_timings: dict[tuple[str, tuple], ShapeTiming] = {}


#: One-row inputs on which a layer shape's kernel result is compared with MLX's before the kernel is chosen.
IDENTITY_ROWS = 4


def time_one_row(layer: nn.Module, layers: int = 1, calls: int = 32, repeats: int = 7) -> ShapeTiming:
    """Device seconds per one-row call of ``layer`` (graphs built before the clock) through MLX's product and
    through the kernel (None where no kernel computes it or the device's probe found none exact), and whether the
    kernel's result equals MLX's on ``IDENTITY_ROWS`` random rows of this shape (the probe runs small shapes; the
    layer's own is checked before its plain steps may use the kernel)."""
    sig = signature(layer)
    x = mx.random.normal((1, 1, sig[2])).astype(sig[5])  # one row of its input features, in its activation type
    mx.eval(x)
    mlx_s = per_call_seconds(lambda: _one_row_call(layer)(x), calls, repeats, built=True)
    kernel_s, identical = None, None
    if kernel_product(layer, x) is not None:
        kernel_s = per_call_seconds(lambda: kernel_product(layer, x), calls, repeats, built=True)
        rows = [mx.random.normal((1, 1, sig[2])).astype(sig[5]) for _ in range(IDENTITY_ROWS)]
        identical = all(bool(mx.array_equal(_one_row_call(layer)(r), kernel_product(layer, r))) for r in rows)
    return ShapeTiming(sig, layers, mlx_s, kernel_s, identical)


def plain_step_seconds(model: nn.Module, steps: int = 16) -> float:
    """Seconds per greedy plain step of ``model``, pipelined as decoding runs them (each step queued before the
    token before it is read): host time and device time overlap, so a kernel that saves device time but costs
    host time gains only where the device, not the host, sets the pace."""
    cache = make_prompt_cache(model)
    y = mx.argmax(model(mx.array([[1, 2, 3, 4]]), cache=cache)[:, -1], axis=-1)
    mx.async_eval(y)
    start = 0.0
    for i in range(steps + 2):
        if i == 2:
            start = time.perf_counter()
        following = mx.argmax(model(y[:, None], cache=cache)[:, -1], axis=-1)
        mx.async_eval(following)
        y.item()
        y = following
    y.item()
    return (time.perf_counter() - start) / (steps + 1)


def plain_logits(model: nn.Module, steps: int = 8) -> list[mx.array]:
    """The logits of ``steps`` greedy plain steps of ``model`` from a fixed prompt (the model's real activations,
    which random rows may not reach: a kernel is kept only where these are bit-identical with and without it)."""
    cache = make_prompt_cache(model)
    logits = model(mx.array([[1, 2, 3, 4]]), cache=cache)[:, -1]
    found = []
    for _ in range(steps):
        mx.eval(logits)
        found.append(logits)
        logits = model(mx.argmax(logits, axis=-1)[:, None], cache=cache)[:, -1]
    return found


@dataclass(frozen=True)
class OneRowChoice:
    """Which layer shapes run one-row products through the kernel: the shapes whose kernel was faster on the
    device (``ShapeTiming.uses_kernel``), kept only where plain steps with them were faster as a whole and their
    logits bit-identical to the steps without them (``identical``; None: not checked)."""

    shapes: list[ShapeTiming]
    step_s: float | None = None
    kernel_step_s: float | None = None
    identical: bool | None = None

    @property
    def confirmed(self) -> bool:
        faster = (
            self.kernel_step_s is not None and self.step_s is not None and self.kernel_step_s <= FASTER_BY * self.step_s
        )
        return faster and self.identical is not False

    @property
    def signatures(self) -> set[tuple]:
        return {t.signature for t in self.shapes if t.uses_kernel} if self.confirmed else set()


#: Choices per (device, the model's layer signatures), made once per process.
_choices: dict[tuple, OneRowChoice] = {}


def one_row_choice(
    model: nn.Module,
    timer: Callable[..., ShapeTiming] = time_one_row,
    step_timer: Callable[[nn.Module], float] = plain_step_seconds,
    rounds: int = 3,
) -> OneRowChoice:
    """Each distinct layer shape of ``model`` timed at one row both ways, then plain steps with the faster kernels
    against plain steps without, ``rounds`` times alternating (medians), and their logits compared bit for bit;
    once per process and device. Off CUDA no kernel runs, so nothing is timed and every layer keeps MLX's
    product; a sharded model keeps them too (its ranks would time apart and might not run the same forwards)."""
    if not kernels.cuda_available() or is_sharded(model):  # ranks timing apart could disagree on collective forwards
        return OneRowChoice([])
    groups: dict[tuple, list[nn.Module]] = {}
    for _, layer in _candidates(model):
        groups.setdefault(signature(layer), []).append(layer)
    device = str(mx.default_device())
    key = (device, tuple(sorted(map(str, groups))))
    if key in _choices:
        return _choices[key]
    shapes = []
    for sig, layers in groups.items():
        if (device, sig) not in _timings:
            _timings[(device, sig)] = timer(layers[0], len(layers))
        shapes.append(replace(_timings[(device, sig)], layers=len(layers)))
    choice = OneRowChoice(shapes)
    if any(t.uses_kernel for t in shapes):
        tentative = OneRowChoice(shapes, 0.0, 0.0)
        plain, through_kernels = [], []
        for _ in range(rounds):
            plain.append(step_timer(model))
            with one_row_kernels(model, tentative):
                through_kernels.append(step_timer(model))
        reference = plain_logits(model)
        with one_row_kernels(model, tentative):
            identical = all(bool(mx.array_equal(a, b)) for a, b in zip(reference, plain_logits(model)))
        if not identical:
            warnings.warn(
                "specbench: plain steps keep MLX's own one-row products on this device: through the one-row kernels "
                "their logits were not bit-identical to MLX's (exact verification is unaffected)",
                stacklevel=2,
            )
        choice = OneRowChoice(shapes, statistics.median(plain), statistics.median(through_kernels), identical)
    _choices[key] = choice
    return choice


class OneRowKernel(nn.Module):
    """A linear layer (or a tied output embedding) whose one-row products run through the row-invariant kernel;
    every other call is the layer's own."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        if type(self.layer) in _EMBEDDING:
            return self.layer(x, *args, **kwargs)
        return self._product(x) if not args and not kwargs and x.size == x.shape[-1] else self.layer(x, *args, **kwargs)

    def as_linear(self, x: mx.array) -> mx.array:
        return self._product(x) if x.size == x.shape[-1] else self.layer.as_linear(x)

    def _product(self, x: mx.array) -> mx.array:
        out = kernel_product(self.layer, x)
        return out if out is not None else _one_row_call(self.layer)(x)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if "layer" not in self:
                raise
            return getattr(self["layer"], name)


@contextlib.contextmanager
def one_row_kernels(model: nn.Module, choice: OneRowChoice | None = None) -> Iterator[list[str]]:
    """Inside, the layers of ``model`` whose shapes ``choice`` (default: ``one_row_choice(model)``) runs through the
    kernel take their one-row calls there; yields the paths of those layers. The model is given its own layers back
    on leaving."""
    chosen = (one_row_choice(model) if choice is None else choice).signatures
    swapped = [(path, layer) for path, layer in _candidates(model) if signature(layer) in chosen]
    if not swapped:
        yield []
        return
    model.update_modules(tree_unflatten([(path, OneRowKernel(layer)) for path, layer in swapped]))
    try:
        yield [path for path, _ in swapped]
    finally:
        model.update_modules(tree_unflatten(swapped))


@contextlib.contextmanager
def own_layers(model: nn.Module) -> Iterator[None]:
    """Inside, the layers ``one_row_kernels`` swapped (if it is open) give way to the model's own, and come back on
    leaving: calibration holds exact levels against serial steps through MLX's own products, wherever it runs (a
    width first used during generation is calibrated inside ``one_row_kernels``)."""
    swapped = [(path, m) for path, m in model.named_modules() if isinstance(m, OneRowKernel)]
    if not swapped:
        yield
        return
    model.update_modules(tree_unflatten([(path, m.layer) for path, m in swapped]))
    try:
        yield
    finally:
        model.update_modules(tree_unflatten(swapped))
