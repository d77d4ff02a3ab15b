"""Attaching a checkpoint's MTP head to an mlx-lm model (which drops those tensors on load), saving and
extracting heads, and the heads shipped with specbench. The checkpoint layouts read are described in
``specbench.models.mtp.layouts``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from specbench.common.files import ASSETS_DIR, write_safetensors_atomic
from specbench.core.forward import text_model
from specbench.models.embedded import model_folder
from specbench.models.moe_twin import twin_head_file
from specbench.models.mtp.checkpoint import INDEX, Checkpoint
from specbench.models.mtp.head import MtpModule, build_head, float_dtype, model_args, model_type, quantize_like_body
from specbench.models.mtp.layouts import (
    DEEPSEEK,
    QWEN,
    ZERO_CENTRED_TYPES,
    Found,
    Layout,
    find_mtp,
    native_layout,
    no_mtp_error,
)

#: Metadata key of files written by specbench: "1" when norms are stored zero-centred.
NORM_KEY = "mtp_zero_centred_norms"


def _check_config(where: str, config: dict[str, Any] | None, model: nn.Module) -> None:
    """One clear error when the checkpoint's config belongs to another model."""
    if not config:
        return
    text = config.get("text_config", config)
    theirs = str(config.get("model_type", text.get("model_type", ""))).removesuffix("_text")
    ours = model_type(model)
    if theirs and theirs != ours:
        raise ValueError(
            f"{where} is a {theirs} checkpoint but the model is {ours}: attach the MTP head of the "
            f"model's own checkpoint"
        )
    args = model_args(model)
    for key in ("hidden_size", "vocab_size", "num_hidden_layers"):
        if key in text and getattr(args, key, None) is not None and int(text[key]) != int(getattr(args, key)):
            raise ValueError(
                f"{where} has {key}={text[key]} but the model has {key}={getattr(args, key)}: it is the "
                f"checkpoint of another model"
            )


def _choose(found: list[Found], model: nn.Module, where: str) -> Found:
    mtype = model_type(model)
    if not found:
        raise no_mtp_error(where, mtype)
    native = native_layout(mtype)
    for layout in (native, QWEN):  # heads saved by specbench use the Qwen layout for any model
        for f in found:
            if f.layout is layout:
                return f
    f = found[0]
    raise ValueError(
        f"{where} holds {f.layout.title}-style MTP tensors ({f.prefix}...) but the model is {mtype}, whose "
        f"MTP head is stored as {native.example} ({native.title}): it is the checkpoint of another model family"
    )


def _stack_experts(tensors: dict[str, mx.array]) -> dict[str, mx.array]:
    """Per-expert and fused-expert MoE tensors -> mlx-lm's stacked ``switch_mlp`` layout."""
    out: dict[str, mx.array] = {}
    experts: dict[tuple[str, str, str], dict[int, mx.array]] = {}
    for k, v in tensors.items():
        m = re.match(r"(.*\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight|scales|biases)$", k)
        if m:
            experts.setdefault((m[1], m[3], m[4]), {})[int(m[2])] = v
            continue
        m = re.match(r"(.*\.mlp)\.experts\.gate_up_proj$", k)
        if m:
            mid = v.shape[-2] // 2
            out[f"{m[1]}.switch_mlp.gate_proj.weight"] = v[..., :mid, :]
            out[f"{m[1]}.switch_mlp.up_proj.weight"] = v[..., mid:, :]
            continue
        m = re.match(r"(.*\.mlp)\.experts\.down_proj$", k)
        if m:
            out[f"{m[1]}.switch_mlp.down_proj.weight"] = v
            continue
        out[k] = v
    for (prefix, proj, kind), by_expert in experts.items():
        n = len(by_expert)
        if sorted(by_expert) != list(range(n)):
            missing = sorted(set(range(max(by_expert) + 1)) - set(by_expert))
            raise ValueError(f"MoE experts {missing} of {prefix}.experts.*.{proj}.{kind} are missing")
        out[f"{prefix}.switch_mlp.{proj}.{kind}"] = mx.stack([by_expert[e] for e in range(n)])
    return out


def read_head_tensors(
    ckpt: Checkpoint, model: nn.Module, where: str, zero_centred: bool | None = None
) -> tuple[Found, dict[str, mx.array]]:
    """The layout found in ``ckpt`` and its MTP tensors renamed to the head's parameter names (lazy arrays)."""
    args = model_args(model)
    _check_config(where, ckpt.config(), model)
    found = _choose(find_mtp(ckpt.names, getattr(args, "num_hidden_layers", None)), model, where)
    layout, prefix = found.layout, found.prefix
    n_body = int(args.num_hidden_layers)
    if layout is DEEPSEEK and prefix != f"model.layers.{n_body}.":
        raise ValueError(
            f"{where}: the MTP layer {prefix[:-1]} does not follow the model's {n_body} layers "
            f"(expected model.layers.{n_body}.*): it is the checkpoint of another model"
        )
    tensors: dict[str, mx.array] = {}
    embeddings = (int(args.vocab_size), int(args.hidden_size))
    for name, value in ckpt.load(found.names).items():
        rest = name[len(prefix) :]
        if "rotary_emb.inv_freq" in rest:
            continue
        if rest in layout.shared:  # the model's own embeddings or head, checked, not loaded
            if tuple(value.shape) != embeddings:
                raise ValueError(
                    f"{where}: MTP tensor {name!r} has shape {tuple(value.shape)} but the model's embeddings are "
                    f"{embeddings}: it is the checkpoint of another model"
                )
            continue
        for src, dst in layout.renames:
            if rest.startswith(src):
                key = dst + rest[len(src) :]
                break
        else:
            if layout is QWEN:
                raise ValueError(f"{where}: unexpected MTP tensor {name!r} (not part of a {layout.title} MTP head)")
            key = "layers.0." + rest
        tensors[key] = value
    tensors = _stack_experts(tensors) if layout is QWEN else _sanitize_like_body(model, tensors)
    if zero_centred is None:
        flag = ckpt.file_metadata.get(NORM_KEY)
        zero_centred = flag == "1" if flag is not None else (layout is QWEN and model_type(model) in ZERO_CENTRED_TYPES)
    if zero_centred:
        tensors = {k: (v + 1.0 if v.ndim == 1 and re.search(r"norm\.weight$", k) else v) for k, v in tensors.items()}
    return found, tensors


def _source_rel(layout: Layout, key: str) -> str:
    """The source name (after the layout prefix) of a head parameter name."""
    for src, dst in layout.renames:
        if key.startswith(dst):
            return src + key[len(dst) :]
    if layout is not QWEN and key.startswith("layers.0."):
        return key[len("layers.0.") :]
    return key


def _sanitize_like_body(model: nn.Module, tensors: dict[str, mx.array]) -> dict[str, mx.array]:
    """Run the decoder-layer tensors through the model's own ``sanitize`` (fp8 dequantization,
    expert stacking, attention re-layout), posing as the body's last layer."""
    sanitize = getattr(model, "sanitize", None)
    if sanitize is None:
        return tensors
    j = int(model_args(model).num_hidden_layers) - 1
    posed = {}
    for k, v in tensors.items():
        rest = k[len("layers.0.") :] if k.startswith("layers.0.") else "specbench_head." + k
        posed[f"model.layers.{j}.{rest}"] = v
    out = {}
    for k, v in sanitize(posed).items():
        rest = k[len(f"model.layers.{j}.") :]
        out[rest[len("specbench_head.") :] if rest.startswith("specbench_head.") else "layers.0." + rest] = v
    return out


def _source_name(found: Found, key: str) -> str:
    m = re.match(r"(.*\.mlp)\.switch_mlp\.(\w+)\.(\w+)$", key)
    rel = (m[1] + f".experts.*.{m[2]}.{m[3]}") if m else key
    return found.prefix + _source_rel(found.layout, rel)


def _check_against(head: MtpModule, tensors: dict[str, mx.array], where: str, model: nn.Module, found: Found):
    expected = dict(tree_flatten(head.parameters()))
    args = model_args(model)
    desc = f"{model_type(model)}, hidden_size={args.hidden_size}"
    for key in expected:
        if key not in tensors:
            raise ValueError(
                f"{where} lacks the MTP tensor {_source_name(found, key)!r} that the model's config ({desc}) needs for "
                f"head parameter {key!r}"
            )
    for key, value in tensors.items():
        if key not in expected:
            raise ValueError(
                f"{where}: MTP tensor {_source_name(found, key)!r} has no place in this model's MTP head ({desc}); "
                f"the checkpoint belongs to a different configuration"
            )
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ValueError(
                f"{where}: MTP tensor {_source_name(found, key)!r} has shape {tuple(value.shape)} but the model's "
                f"config ({desc}) needs {tuple(expected[key].shape)}"
            )


def load_head(model: nn.Module, path: str | Path, zero_centred: bool | None = None) -> MtpModule:
    """Build the MTP head for ``model`` from the MTP tensors of a checkpoint (not attached)."""
    ckpt = Checkpoint(path)
    where = str(ckpt.path)
    found, tensors = read_head_tensors(ckpt, model, where, zero_centred)
    depth = max((int(m[1]) + 1 for k in tensors if (m := re.match(r"layers\.(\d+)\.", k))), default=0)
    if depth == 0:
        raise ValueError(f"{where} lacks the MTP decoder layer ({found.prefix}layers.0.* / decoder-layer tensors)")
    config = ckpt.config() or {}
    want = config.get("text_config", config).get("mtp_num_hidden_layers")
    if want is not None and int(want) != depth:
        missing = f"{found.prefix}layers.{depth}." if depth < int(want) else f"{found.prefix}layers.{want}."
        raise ValueError(
            f"{where}: the config says mtp_num_hidden_layers={want} but the checkpoint holds {depth} MTP "
            f"layer(s) (see tensors {missing}*)"
        )
    head = build_head(model, depth, found.layout)
    _check_against(head, tensors, where, model, found)
    # The tensors cast to the model's float dtype (but what its cast_predicate keeps out), quantized like its body.
    dtype = float_dtype(model)
    keep = (
        getattr(text_model(model), "cast_predicate", None) or getattr(model, "cast_predicate", None) or (lambda k: True)
    )
    cast = {k: (v.astype(dtype) if mx.issubdtype(v.dtype, mx.floating) and keep(k) else v) for k, v in tensors.items()}
    head.update(tree_unflatten(list(cast.items())))
    quantize_like_body(model, head)
    mx.eval(head.parameters())
    head.eval()
    return head


def attach_mtp(model: nn.Module, path: str | Path, zero_centred: bool | None = None) -> MtpModule:
    """Attach the MTP head stored in ``path`` to ``model`` (as ``model.mtp``) and return it.

    ``path`` is a ``.safetensors`` file or a checkpoint folder (sharded through
    ``model.safetensors.index.json``); only the MTP tensors are read, from the shards holding
    them. The head is quantized like the model's body. ``zero_centred`` overrides whether the
    file's RMSNorm weights are stored zero-centred (default: as the checkpoint family stores them).
    """
    head = load_head(model, path, zero_centred)
    model.mtp = head
    return head


def get_head(model: nn.Module) -> MtpModule:
    head = model.get("mtp") if isinstance(model, dict) else getattr(model, "mtp", None)
    if not isinstance(head, MtpModule):
        raise ValueError(
            "the model has no MTP head: attach one with specbench.attach_mtp(model, path) "
            "(or train one with `specbench train-mtp`)"
        )
    return head


# -- writing ---------------------------------------------------------------------------------
def save_head(head: MtpModule, path: str | Path, config: dict[str, Any], extra: dict[str, str] | None = None) -> Path:
    """Save a float head as ``mtp.*`` tensors (Qwen layout, norms as stored, not zero-centred)."""
    path = Path(path)
    tensors = {f"mtp.{k}": v for k, v in tree_flatten(head.parameters())}
    if any(k.endswith(".scales") for k in tensors):
        raise ValueError("save_head needs a float head (this one is quantized)")
    metadata = {"format": "mlx", NORM_KEY: "0", "config": json.dumps(config), **(extra or {})}
    return write_safetensors_atomic(path, tensors, metadata)


def _download_mtp_shards(repo: str) -> Path:
    """Download a hub checkpoint's config, index and only the shards holding MTP tensors."""
    from huggingface_hub import hf_hub_download

    try:
        hf_hub_download(repo, "config.json")
        try:
            folder = Path(hf_hub_download(repo, INDEX)).parent
        except Exception:
            return Path(hf_hub_download(repo, "model.safetensors")).parent
    except Exception as e:
        raise ValueError(f"could not fetch {repo} from the Hugging Face hub ({type(e).__name__}: {e})") from e
    ckpt = Checkpoint(folder)
    for shard in sorted({ckpt.weight_map[n] for n in _mtp_tensors(ckpt, repo).names}):
        hf_hub_download(repo, shard)
    return folder


def _mtp_tensors(ckpt: Checkpoint, where: str) -> Found:
    """The MTP tensors of ``ckpt`` (of the first layout found)."""
    config = ckpt.config() or {}
    found = find_mtp(ckpt.names, config.get("text_config", config).get("num_hidden_layers"))
    if not found:
        raise no_mtp_error(where, str(config.get("model_type", "unknown")))
    return found[0]


def extract_mtp(src: str | Path, dst: str | Path) -> Path:
    """Write only the MTP tensors of checkpoint ``src`` (a folder, a file, or a hub id) to ``dst``.

    Tensors keep their names and values; the file's metadata carries the source config, so
    ``attach_mtp`` checks it against the model as it would the full checkpoint.
    """
    src, path = str(src), Path(src).expanduser()
    hub_id = not path.exists() and re.fullmatch(r"[\w.\-]+/[\w.\-]+", src) is not None
    ckpt = Checkpoint(_download_mtp_shards(src) if hub_id else path)
    f = _mtp_tensors(ckpt, src)
    tensors = ckpt.load(f.names)
    metadata = {"format": "mlx", "source": src, "mtp_layout": f.layout.name}
    config = ckpt.config()
    if config:
        metadata["config"] = json.dumps(config)
    if NORM_KEY in ckpt.file_metadata:
        metadata[NORM_KEY] = ckpt.file_metadata[NORM_KEY]
    dst = Path(dst).expanduser()
    if dst.suffix != ".safetensors":
        dst = dst / "mtp.safetensors"
    return write_safetensors_atomic(dst, tensors, metadata)


#: Heads shipped with specbench, by embedded model name.
SHIPPED_HEADS = {"smollm2-135m": "smollm2-135m.safetensors"}
#: MoE twins of embedded models: their heads are the twins of the dense model's head.
TWIN_OF = {"smollm2-135m-moe": "smollm2-135m"}


def assets_dir() -> Path:
    return ASSETS_DIR / "mtp"


def shipped_head(model_name: str) -> Path | None:
    """The shipped head file of an embedded model (None when there is none)."""
    name = str(model_name)
    if name in TWIN_OF:
        dense = shipped_head(TWIN_OF[name])
        path = model_folder(name) / "mtp.safetensors"
        if not path.exists() or path.stat().st_mtime < dense.stat().st_mtime:
            twin_head_file(dense, path)
        return path
    if name not in SHIPPED_HEADS:
        return None
    path = assets_dir() / SHIPPED_HEADS[name]
    if not path.exists():
        raise FileNotFoundError(
            f"the MTP head of {name} is missing from {path}: train one with "
            f"`specbench train-mtp --model {name} --out DIR` and attach DIR/mtp.safetensors"
        )
    return path
