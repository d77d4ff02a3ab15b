"""Where checkpoints keep an MTP head: three tensor layouts (Qwen3-Next/Qwen3.5 and heads saved by specbench,
DeepSeek-V3/GLM-4.5, MiMo; each ``Layout`` says how its tensors map to the head's), and finding them among a
checkpoint's tensor names. Raw Hugging Face checkpoints of the Qwen3-Next family store RMSNorm weights
zero-centred (the norm multiplies by 1 + w); MoE layers come per expert or fused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Model types whose raw checkpoints store RMSNorm weights zero-centred.
ZERO_CENTRED_TYPES = {"qwen3_next", "qwen3_5", "qwen3_5_moe"}
#: Model types whose own MTP tensors use the DeepSeek or MiMo layout.
DEEPSEEK_TYPES = {"deepseek_v3", "deepseek_v32", "glm4_moe", "glm4_moe_lite", "kimi_k2"}
MIMO_TYPES = {"mimo"}


@dataclass(frozen=True)
class Layout:
    name: str
    title: str
    example: str
    hidden_first: bool
    chain_normed: bool
    #: source module prefix (after the layout prefix) -> head module prefix
    renames: tuple[tuple[str, str], ...]
    #: tensors duplicating the model's own (shape-checked, not loaded)
    shared: tuple[str, ...] = ()


#: The head's modules (the prefixes its tensors have), in the order ``_renames`` takes them.
_HEAD_MODULES = ("fc.", "pre_fc_norm_embedding.", "pre_fc_norm_hidden.", "norm.")


def _renames(fc: str, norm_embedding: str, norm_hidden: str, norm: str) -> tuple[tuple[str, str], ...]:
    """(checkpoint prefix, head prefix) pairs of a layout whose checkpoints name the head's modules so."""
    return tuple(zip((fc, norm_embedding, norm_hidden, norm), _HEAD_MODULES))


QWEN = Layout(
    "qwen",
    "Qwen3-Next/Qwen3.5",
    "mtp.fc.weight",
    hidden_first=False,
    chain_normed=True,
    renames=tuple((name, name) for name in (*_HEAD_MODULES, "layers.")),
)
DEEPSEEK = Layout(
    "deepseek",
    "DeepSeek-V3/GLM-4.5",
    "model.layers.{N}.eh_proj.weight",
    hidden_first=False,
    chain_normed=False,
    renames=_renames("eh_proj.", "enorm.", "hnorm.", "shared_head.norm."),
    shared=("shared_head.head.weight", "embed_tokens.weight"),
)
MIMO = Layout(
    "mimo",
    "MiMo",
    "model.mtp_layers.0.input_proj.weight",
    hidden_first=True,
    chain_normed=True,
    renames=_renames("input_proj.", "token_layernorm.", "hidden_layernorm.", "final_layernorm."),
)


def native_layout(mtype: str) -> Layout:
    if mtype in DEEPSEEK_TYPES:
        return DEEPSEEK
    if mtype in MIMO_TYPES:
        return MIMO
    return QWEN


@dataclass
class Found:
    """The MTP tensors of one layout found in a checkpoint."""

    layout: Layout
    prefix: str
    names: list[str]


def find_mtp(names: list[str], num_hidden_layers: int | None) -> list[Found]:
    """The MTP tensor groups present in a list of tensor names (one per layout found)."""
    qwen = sorted({n[: -len("fc.weight")] for n in names if re.search(r"(^|\.)mtp\.fc\.weight$", n)})
    prefixes = [(QWEN, prefix) for prefix in qwen[:1]]
    ds = sorted({int(m[1]) for n in names if (m := re.match(r"model\.layers\.(\d+)\.eh_proj\.weight$", n))})
    if ds:
        first = ds[0] if num_hidden_layers is None or num_hidden_layers not in ds else num_hidden_layers
        prefixes.append((DEEPSEEK, f"model.layers.{first}."))
    mimo = sorted({int(m[1]) for n in names if (m := re.match(r"model\.mtp_layers\.(\d+)\.input_proj\.weight$", n))})
    if mimo:
        prefixes.append((MIMO, f"model.mtp_layers.{mimo[0]}."))
    return [Found(layout, prefix, [n for n in names if n.startswith(prefix)]) for layout, prefix in prefixes]


def no_mtp_error(where: str, mtype: str) -> ValueError:
    return ValueError(
        f"{where} holds no MTP tensors (looked for {QWEN.example} ({QWEN.title}), {DEEPSEEK.example} "
        f"({DEEPSEEK.title}) and {MIMO.example} ({MIMO.title})) for this {mtype} model. Checkpoints converted "
        f"by mlx-lm drop them: point to the original Hugging Face checkpoint, a file written by "
        f"`specbench extract-mtp`, or a head trained with `specbench train-mtp`"
    )
