"""Memory bandwidth: the device's measured peak, and what a decoding speed achieves against it; the weights a
forward reads, of an MoE model the distinct experts its rows route to.

Decoding one token reads (at least) the model's weights once, so ``bytes_per_forward(model)`` x tokens/s
is the bandwidth a run achieves; ``peak_bandwidth()`` times a pass over a large array on the default device
(once per device and MLX version, kept under ``$SPECBENCH_HOME/profiles`` beside the cost profiles).
Every speed can then be read against its limit: ``achieved(model, tokens_per_s)``. A verification of w tokens
reads every expert any of its rows routes to: under uniform routing of top-K of E experts, E (1 - (1 - K/E)^w)
per layer (``expected_distinct_experts``; scripts/gpu/cost.py measures them).
"""

from __future__ import annotations

import json
import timeit
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from specbench.common.files import home, read_or_set_aside, write_json_atomic
from specbench.common.identity import device_name, kernel_key, versions
from specbench.core.forward import text_model

#: Bytes of the array the peak is measured over on the CPU (large enough to leave every cache behind; 1 GiB on a GPU).
COPY_BYTES = 256 * 2**20


def bytes_per_forward(model: nn.Module, rows: int = 1) -> int:
    """Weight bytes a forward of ``rows`` tokens reads (one decode step: ``rows`` = 1): every parameter once, but of
    routed experts (mlx-lm's SwitchGLU and friends, whose weights stack the experts) only the share the rows are
    expected to touch (``expected_distinct_experts``: each token's choice uniform and independent), and of an
    untied embedding table none (one row is gathered; a tied one is read whole as the output layer)."""
    tied = bool(getattr(getattr(model, "args", None), "tie_word_embeddings", False))
    try:
        experts, per_token = routing(model)
    except ValueError:  # a dense model
        experts, per_token = 0, 0
    total = 0.0
    for name, value in tree_flatten(model.parameters()):
        if "embed_tokens" in name and not tied:
            continue
        share = 1.0
        if experts and value.ndim >= 3 and value.shape[0] == experts:
            share = expected_distinct_experts(experts, per_token, rows) / experts
        total += value.nbytes * share
    return int(total)


def expected_distinct_experts(num_experts: int, top_k: int, width: int) -> float:
    """Expected distinct experts per layer for ``width`` tokens under uniform top-K routing."""
    if not 0 < top_k <= num_experts:
        raise ValueError(f"need 0 < top_k <= num_experts, got top_k={top_k}, num_experts={num_experts}")
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** width)


def routing(model: nn.Module) -> tuple[int, int]:
    """(num_experts, experts per token) of an MoE model."""
    args = getattr(text_model(model), "args", None)
    experts = getattr(args, "num_experts", None) or getattr(args, "num_local_experts", None)
    experts = experts or getattr(args, "n_routed_experts", None)
    top_k = getattr(args, "num_experts_per_tok", None)
    if not experts or not top_k:
        raise ValueError("this model has no num_experts / num_experts_per_tok in its args: is it an MoE model?")
    return int(experts), int(top_k)


#: How the peak is measured; a stored peak measured another way is measured again.
PEAK_METHOD = (
    "gpu: the faster of a read-only sum over a 1 GiB float32 array and a bfloat16 matrix-vector product over a "
    "1 GiB matrix; cpu: numpy copy (read + write)"
)


def _fastest(run, repeats: int) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``run``, after one untimed warm-up call."""
    run()
    return min(timeit.repeat(run, number=1, repeat=repeats))


def peak_passes(nbytes: int = COPY_BYTES, repeats: int = 3) -> dict[str, float]:
    """Bytes per second of each pass the peak is taken from (``PEAK_METHOD``), fastest of ``repeats`` each. On
    the CPU numpy's copy (MLX's CPU kernels are compute-bound, not a measure of memory)."""
    if mx.default_device().type != mx.DeviceType.gpu:
        src, dst = np.ones(nbytes // 4, dtype=np.float32), np.empty(nbytes // 4, dtype=np.float32)
        return {"numpy copy": 2 * nbytes / _fastest(lambda: np.copyto(dst, src), repeats)}
    return mlx_passes(max(nbytes, 2**30), repeats)


def mlx_passes(nbytes: int, repeats: int = 3, cols: int = 8192) -> dict[str, float]:
    """Bytes per second MLX reads on the default device: a sum over ``nbytes`` of float32, and a bfloat16
    matrix (``nbytes`` of it, ``cols`` wide) times a vector; fastest of ``repeats`` each."""
    flat = mx.ones((nbytes // 4,), dtype=mx.float32)
    matrix = mx.ones((max(1, nbytes // 2 // cols), cols), dtype=mx.bfloat16)
    vector = mx.ones((cols,), dtype=mx.bfloat16)
    mx.eval(flat, matrix, vector)
    mx.synchronize()

    def timed(make):
        def run():
            mx.eval(make())
            mx.synchronize()

        return _fastest(run, repeats)

    return {
        "sum": flat.nbytes / timed(lambda: mx.sum(flat)),
        "matrix-vector": matrix.nbytes / timed(lambda: matrix @ vector),
    }


def _measure_peak(nbytes: int = COPY_BYTES, repeats: int = 3) -> float:
    """The device's peak in bytes/s: the fastest of ``peak_passes``."""
    return max(peak_passes(nbytes, repeats).values())


def _cache_path(root: Path | None = None) -> Path:
    slug = "".join(ch if ch.isalnum() else "-" for ch in device_name()).strip("-").lower()
    return (root or home()) / "profiles" / f"bandwidth--{slug}--mlx{versions()['mlx']}.json"


_peaks: dict[str, float] = {}


def _read_peak(path: Path) -> float | None:
    """A stored peak bandwidth, None where measured on other kernels or by another method; a ValueError saying what
    is wrong with a damaged one: the one check of its readers."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"a JSON object was expected, not {type(data).__name__}")
    peak = data.get("bytes_per_s")
    if not (isinstance(peak, (int, float)) and not isinstance(peak, bool) and 0 < peak < float("inf")):
        raise ValueError(f"bytes_per_s is {peak!r}, not a finite rate above zero")
    return float(peak) if data.get("kernels") == kernel_key() and data.get("method") == PEAK_METHOD else None


def peak_bandwidth(root: Path | None = None, refresh: bool = False) -> float:
    """The default device's memory bandwidth in bytes/s as MLX reaches it (``PEAK_METHOD``), measured once
    and kept beside the cost profiles."""
    path = _cache_path(root)
    key = str(path)
    if not refresh and key in _peaks:
        return _peaks[key]
    try:  # a damaged file is measured again and rewritten
        peak = None if refresh else read_or_set_aside(path, _read_peak, "measured peak bandwidth")
    except OSError:
        peak = None
    if peak is None:
        peak = _measure_peak()
        try:
            stored = {"device": device_name(), "kernels": kernel_key(), "method": PEAK_METHOD, "bytes_per_s": peak}
            write_json_atomic(path, stored)
        except OSError:
            pass  # a read-only home: the measurement still stands for this process
    _peaks[key] = peak
    return peak


@dataclass
class Bandwidth:
    """A decoding speed read against the device's memory bandwidth."""

    tokens_per_s: float
    bytes_per_token: int
    peak_bytes_per_s: float

    @property
    def bytes_per_s(self) -> float:
        return self.tokens_per_s * self.bytes_per_token

    @property
    def fraction(self) -> float:
        """Achieved / peak."""
        return self.bytes_per_s / self.peak_bytes_per_s if self.peak_bytes_per_s else float("nan")

    @property
    def limit_tokens_per_s(self) -> float:
        """The tokens/s at which reading the weights alone would take all of the measured peak."""
        return self.peak_bytes_per_s / self.bytes_per_token if self.bytes_per_token else float("nan")

    def describe(self) -> str:
        return (
            f"{self.tokens_per_s:.1f} tok/s x {self.bytes_per_token / 1e6:.0f} MB of weights per token = "
            f"{self.bytes_per_s / 1e9:.2f} GB/s, {self.fraction:.0%} of this device's measured "
            f"{self.peak_bytes_per_s / 1e9:.1f} GB/s (bandwidth limit {self.limit_tokens_per_s:.0f} tok/s)"
        )


def achieved(model: nn.Module, tokens_per_s: float, root: Path | None = None) -> Bandwidth:
    """``tokens_per_s`` of ``model`` against the device's measured memory bandwidth."""
    return Bandwidth(float(tokens_per_s), bytes_per_forward(model), peak_bandwidth(root))


def describe_speeds(model: nn.Module, speeds: dict[str, float], root: Path | None = None) -> list[str]:
    """One line per named decoding speed (tokens/s) read against the device's measured memory bandwidth."""
    return [f"{name}: {achieved(model, tps, root).describe()}" for name, tps in speeds.items() if tps and tps > 0]
