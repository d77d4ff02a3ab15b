"""What a measurement is keyed by: the device, the library versions and the model's shape."""

from __future__ import annotations

import hashlib
from importlib.metadata import PackageNotFoundError, version

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
from mlx.utils import tree_flatten


def device_name() -> str:
    """The default device, e.g. ``gpu:NVIDIA H200`` or ``cpu:Intel(R) Xeon(R) Processor``."""
    info = mx.device_info()
    name = info.get("device_name") or info.get("architecture") or "unknown"
    return f"{mx.default_device().type.name}:{name}"


def versions() -> dict[str, str]:
    """The versions of MLX, mlx-lm and specbench."""
    try:
        specbench = version("specbench")
    except PackageNotFoundError:
        specbench = "unknown"
    return {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "specbench": specbench}


def model_key(model: nn.Module) -> str:
    """An id of what a model's cost depends on: its type and every parameter's name, shape and
    dtype (two fine-tunes of one architecture share it; a 4-bit and a bf16 version do not)."""
    lm = getattr(model, "language_model", model)
    model_type = getattr(getattr(lm, "args", None), "model_type", None) or type(model).__module__.split(".")[-1]
    digest = hashlib.sha1()
    for name, value in tree_flatten(model.parameters()):
        digest.update(f"{name}:{tuple(value.shape)}:{value.dtype};".encode())
    return f"{model_type}-{digest.hexdigest()[:12]}"


def display_name(model: nn.Module) -> str:
    """The name a model was loaded under, when known (else its key)."""
    return getattr(model, "specbench_name", None) or model_key(model)
