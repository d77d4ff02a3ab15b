"""The training phases of the drafters experiment (``scripts/gpu/drafters.py``), each recorded into the run's
``results`` and writing what would ship as soon as it exists.

``head_phase``: a new MTP head (``train_head``) scored against the shipped one on the held-out split; its file and
record are written only when it wins (``head_decision``). ``draft_phase``: a small draft model distilled from the
target (``train_draft``), its own layers saved in bfloat16 (the embeddings and output head are the target's), then
scored as shipped (loaded back from that file).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from scripts.gpu.draft_training import train_draft
from scripts.gpu.drafter_eval import K, evaluate, head_decision
from specbench.common.files import write_json_atomic, write_safetensors_atomic
from specbench.core.forward import text_model
from specbench.drafters import DraftModel, MtpHead
from specbench.drafters.draft_model import draft_metadata, draft_own_tensors, load_draft_model
from specbench.models.load import cast_dtype
from specbench.models.mtp.attach import save_head
from specbench.models.mtp.head import MtpModule, model_type
from specbench.train.mtp_data import WindowSampler
from specbench.train.mtp_training import TrainConfig, train_head

Say = Callable[[str], None]


def head_phase(
    model: nn.Module,
    sampler: WindowSampler,
    split: dict[str, Any],
    config: TrainConfig,
    shipped: MtpModule,
    tokens: int,
    results: dict[str, Any],
    out: Path,
    name: str,
    say: Say,
) -> tuple[MtpModule, dict[str, Path]]:
    """Train a head for ``model`` (named ``name``) within ``config``, score it and the ``shipped`` head on
    ``split`` (``tokens`` per prompt) into ``results["evaluation"]``, decide (``results["mtp"]``); when the new
    head wins, write mtp-``name``.safetensors (bfloat16) and its record mtp-``name``.json into ``out``. Returns the
    head and the files written ("mtp", "mtp_record"; none when the shipped head stays)."""
    json_path = out / "drafters.json"
    dtype = text_model(model).model.norm.weight.dtype
    head, training = train_head(model, sampler, config, say)
    cast_dtype(head, dtype)
    recipe = {"depth": config.depth, "depth_decay": config.depth_decay, "mix": config.mix, "init": config.init}
    results["mtp"] = {"recipe": recipe, "training": training}
    write_json_atomic(json_path, results)
    evaluation = results["evaluation"]
    evaluation["mtp (new)"] = new = evaluate("mtp (new)", model, split, tokens, lambda: MtpHead(model, head=head), say)
    evaluation["mtp (shipped)"] = old = evaluate(
        "mtp (shipped)", model, split, tokens, lambda: MtpHead(model, head=shipped), say
    )
    results["mtp"].update(head_decision(new, old))
    say(results["mtp"]["decision"])
    files: dict[str, Path] = {}
    if results["mtp"]["ships"]:
        args = text_model(model).args
        model_config = {k: getattr(args, k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")}
        model_config["model_type"] = model_type(model)
        cast_dtype(head, mx.bfloat16)
        files["mtp"] = save_head(head, out / f"mtp-{name}.safetensors", model_config, {"model": name})
        record = {"model": name, "recipe": recipe, "data": results.get("data"), "training": training}
        record["heldout_split"] = {"sources": split["sources"], "k": K, "tokens": tokens}
        record["metrics"] = {"decoding_heldout": new, "replaced_head_decoding_heldout": old}
        files["mtp_record"] = write_json_atomic(out / f"mtp-{name}.json", record)
    write_json_atomic(json_path, results)
    return head, files


def draft_phase(
    model: nn.Module,
    sampler: WindowSampler,
    split: dict[str, Any],
    config: TrainConfig,
    layers: int,
    mlp: int | None,
    tokens: int,
    results: dict[str, Any],
    out: Path,
    name: str,
    say: Say,
) -> tuple[nn.Module, Path]:
    """Distil a ``layers``-layer draft model (``mlp`` MLP channels) of ``model`` within ``config``, write its own
    layers to draft-``name``.safetensors in ``out`` (bfloat16), record it (``results["draft_model"]``, its own
    parameter count in ``results["parameters"]``) and score it as shipped, loaded back from that file, into
    ``results["evaluation"]["draft-model"]``. Returns the loaded draft model and its file."""
    json_path = out / "drafters.json"
    draft, training = train_draft(model, sampler, config, layers, say, mlp)
    own = {k: v.astype(mx.bfloat16) for k, v in draft_own_tensors(draft).items()}
    meta = draft_metadata(layers, name, {"source_layers": training["source_layers"]}, mlp)
    path = write_safetensors_atomic(out / f"draft-{name}.safetensors", own, meta)
    results["draft_model"] = {"layers": layers, "intermediate_size": mlp, "training": training}
    results.setdefault("parameters", {})["draft_own"] = int(sum(v.size for v in own.values()))
    write_json_atomic(json_path, results)
    shipped = load_draft_model(model, path)  # as shipped: bfloat16 layers, the target's embeddings
    results["evaluation"]["draft-model"] = evaluate(
        "draft-model", model, split, tokens, lambda: DraftModel(shipped, target=model), say
    )
    write_json_atomic(json_path, results)
    return shipped, path


def parameter_count(module: nn.Module) -> int:
    """Every parameter of ``module``, trainable or frozen."""
    return int(sum(v.size for _, v in tree_flatten(module.parameters())))
