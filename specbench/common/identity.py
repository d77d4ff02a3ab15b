"""What a measurement is keyed by: the device, the library versions and the model's shape."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
from mlx.utils import tree_flatten

from specbench.common.blas import blas_in_use
from specbench.common.files import PROJECT_ROOT, safe_name, write_json_atomic

#: The commit a copy of the source without its git history runs (a GPU machine's), set by whoever copied it:
#: "SHA" or "SHA-dirty".
COMMIT_ENV = "SPECBENCH_COMMIT"


def device_name() -> str:
    """The default device, e.g. ``gpu:NVIDIA H200`` or ``cpu:Intel(R) Xeon(R) Processor``."""
    info = mx.device_info()
    name = info.get("device_name") or info.get("architecture") or "unknown"
    return f"{mx.default_device().type.name}:{name}"


def versions() -> dict[str, str]:
    """The versions of MLX, mlx-lm and specbench, and the commit of specbench's source (``commit``)."""
    try:
        specbench = version("specbench")
    except PackageNotFoundError:
        specbench = "unknown"
    return {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "specbench": specbench, "commit": commit()}


@functools.cache
def commit() -> str:
    """The commit of the source this process runs: its git checkout's HEAD, with "-dirty" where tracked files differ
    from it (``SPECBENCH_COMMIT`` where the source was copied without its history); "unknown" where neither tells."""
    given = os.environ.get(COMMIT_ENV, "").strip()
    if given:
        return given

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(PROJECT_ROOT), *args], capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return "unknown"
        changed = git("status", "--porcelain", "--untracked-files=no", "--", "specbench")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if changed.stdout.strip() else "")


def provenance(command: list[str] | None = None) -> dict[str, Any]:
    """What a result file names of the code and machine that made it: the commit (``commit``), the versions, the
    device, the CPU's BLAS, the date and the command line."""
    return {
        **versions(),
        "device": device_name(),
        "blas": blas_library(),
        "date": utc_now(),
        "command": " ".join(command if command is not None else sys.argv),
    }


def utc_now() -> str:
    """Now in UTC as ISO text to the second: when a measurement or a result was made."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def blas_library() -> str | None:
    """The BLAS MLX's CPU kernels run on (``specbench.common.blas.blas_in_use``: e.g. MLX's reference
    ``libblas-bd8a282c.so.3.10.0``, or "OpenBLAS 0.3.21, 2 threads" preloaded); None on a GPU."""
    if mx.default_device().type == mx.DeviceType.gpu:
        return None
    return blas_in_use()


#: Per CUDA library: the shared objects MLX's CUDA backend loads, the function that reports the version of the one
#: loaded, and its pip packages (MLX's CUDA wheels install them).
_CUDA_LIBRARIES: dict[str, tuple[tuple[str, ...], str, tuple[str, ...]]] = {
    "driver": (("libcuda.so.1",), "cuDriverGetVersion", ()),
    "cuda": (
        ("libcudart.so.13", "libcudart.so.12"),
        "cudaRuntimeGetVersion",
        ("nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"),
    ),
    "cudnn": (("libcudnn.so.9",), "cudnnGetVersion", ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12")),
}


def cuda_libraries() -> dict[str, str]:
    """On MLX's CUDA backend, what its kernels run on: the device's architecture and the driver, CUDA runtime and
    cuDNN versions, as MLX reports them (``mx.device_info()``: ``architecture``, and ``driver_version``,
    ``cuda_version``, ``cudnn_version`` where an MLX reports them), else as the library this process loaded reports
    its own (``cuDriverGetVersion``, ``cudaRuntimeGetVersion``, ``cudnnGetVersion``), else its pip package's
    version ("unknown" where none tells); {} elsewhere."""
    cuda = getattr(mx, "cuda", None)
    if mx.default_device().type != mx.DeviceType.gpu or cuda is None or not cuda.is_available():
        return {}
    info = mx.device_info()
    found = {"architecture": str(info.get("architecture") or "unknown")}
    for name, (libraries, function, packages) in _CUDA_LIBRARIES.items():
        reported = info.get(f"{name}_version")
        found[name] = str(reported) if reported not in (None, "") else _loaded_version(libraries, function, packages)
    return found


@functools.cache
def _loaded_version(libraries: tuple[str, ...], function: str, packages: tuple[str, ...]) -> str:
    """The version a loaded shared library reports (``function``: an int out-parameter, or cuDNN's return value),
    else the first installed pip package's version, else "unknown"."""
    import ctypes

    for name in libraries:
        try:  # only a library this process loaded already (RTLD_NOLOAD): the one MLX runs
            lib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            if function == "cudnnGetVersion":
                lib.cudnnGetVersion.restype = ctypes.c_size_t
                return str(lib.cudnnGetVersion())
            out = ctypes.c_int(0)
            if getattr(lib, function)(ctypes.byref(out)) == 0:
                return str(out.value)
        except (OSError, AttributeError):
            continue
    for package in packages:
        try:
            return version(package)
        except PackageNotFoundError:
            continue
    return "unknown"


def kernel_key() -> str:
    """What the kernels a measurement ran on depend on, as text: the device, the MLX and mlx-lm
    versions and, on the CPU, the BLAS library in use. (Exact verification adds the cuDNN
    attention setting, ``specbench.exact.calibration.calibration_key``; a model's dtype is part
    of ``model_key``.)"""
    vers = versions()
    blas = blas_library()
    return f"{device_name()}|mlx {vers['mlx']}|mlx_lm {vers['mlx_lm']}" + (f"|blas {blas}" if blas else "")


def model_key(model: nn.Module) -> str:
    """An id of what a model's cost depends on: its type and every parameter's name, shape and
    dtype (two fine-tunes of one architecture share it; a 4-bit and a bf16 version do not); a model
    sharded over ranks adds the group size and backend (``-tp2-ring``): its cost includes their all-reduces."""
    lm = getattr(model, "language_model", model)
    model_type = getattr(getattr(lm, "args", None), "model_type", None) or type(model).__module__.split(".")[-1]
    digest = hashlib.sha1()
    for name, value in tree_flatten(model.parameters()):
        digest.update(f"{name}:{tuple(value.shape)}:{value.dtype};".encode())
    group = getattr(model, "specbench_group", None)  # (size, backend) of a model sharded over ranks
    return f"{safe_name(model_type)}-{digest.hexdigest()[:12]}" + (f"-tp{group[0]}-{group[1]}" if group else "")


def token_map(tokenizer: Any) -> dict[str, int] | None:
    """A tokenizer's map of token text to id (its ``get_vocab``, or its wrapped tokenizer's), None where it has none."""
    for owner in (tokenizer, getattr(tokenizer, "_tokenizer", None)):
        get = getattr(owner, "get_vocab", None)
        if callable(get):
            return dict(get())
    return None


def tokenizer_key(tokenizer: Any) -> str:
    """An id of a tokenizer's vocabulary: a digest of its token-to-id map ("" where it has none). Two runs whose
    tokenizers share it read the same token ids as the same text."""
    vocab = token_map(tokenizer)
    if vocab is None:
        return ""
    text = json.dumps(sorted(vocab.items()), ensure_ascii=False)
    return f"{len(vocab)}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def display_name(model: nn.Module) -> str:
    """The name a model was loaded under, when known (else its key)."""
    return getattr(model, "specbench_name", None) or model_key(model)


def write_result(path: str | os.PathLike, data: Any) -> Any:
    """Write a result file (JSON, atomically) that names the code and machine that made it: ``data`` (a dict, else
    under "data") with the ``provenance`` of this run first."""
    body = data if isinstance(data, dict) else {"data": data}
    return write_json_atomic(path, {"provenance": provenance(), **{k: v for k, v in body.items() if k != "provenance"}})


def result_data(data: Any) -> Any:
    """What ``write_result`` wrote, without its provenance: the data a non-dict result was written as (files from
    before results named their code are returned as they are)."""
    if isinstance(data, dict) and "provenance" in data and set(data) == {"provenance", "data"}:
        return data["data"]
    return data
