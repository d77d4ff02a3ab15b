"""Drafters: what proposes tokens for verification (the protocol is ``specbench.core.draft``)."""

from __future__ import annotations

from typing import Any

from specbench.core.draft import Draft, Drafter
from specbench.drafters.draft_model import DraftModel, shipped_draft_model
from specbench.drafters.early_exit import EarlyExit, exit_layer_count
from specbench.drafters.lookup import PromptLookup
from specbench.drafters.mtp import MtpHead
from specbench.drafters.oracle import Oracle
from specbench.drafters.registry import (
    DRAFTERS,
    NO_DRAFTER,
    DrafterInputs,
    drafter_choices,
    drafter_kinds,
    is_drafter_name,
    register_drafter,
    split_drafter_name,
)
from specbench.drafters.suffix import SuffixDecoding


def make_drafter(
    name: str,
    model: Any = None,
    model_name: str | None = None,
    draft_model: Any = None,
    max_draft: int | None = None,
) -> Drafter | None:
    """A fresh drafter by registered name (``drafter_choices()``; ``NAME:N`` for one that takes a parameter, such
    as ``suffix:K`` or ``early-exit:L``), or None for ``none``. ``model``: the target, for the drafters that need
    it; ``draft_model``: the draft model's (else the one shipped for ``model_name``); ``max_draft``: the longest
    draft the caller will ask for, when known. ``model_name`` defaults to the name the model was loaded by
    (``specbench.models.load``), so that an embedded model's shipped MTP head and draft model are found wherever
    it is passed without its name. Unknown names and missing inputs are one clear ValueError."""
    kind, value = split_drafter_name(name)
    if kind is None:
        return None
    if kind.needs and model is None:
        raise ValueError(f"drafter {name!r} needs the target model: pass model=")
    model_name = model_name or getattr(model, "specbench_name", None)
    drafter = kind.build(DrafterInputs(model, model_name, draft_model, value, max_draft))
    if value is not None and drafter.name == kind.name:
        drafter.name = f"{kind.name}:{value}"
    return drafter


__all__ = [
    "DRAFTERS",
    "NO_DRAFTER",
    "Draft",
    "DraftModel",
    "EarlyExit",
    "MtpHead",
    "Oracle",
    "PromptLookup",
    "SuffixDecoding",
    "drafter_choices",
    "drafter_kinds",
    "exit_layer_count",
    "is_drafter_name",
    "make_drafter",
    "register_drafter",
    "shipped_draft_model",
]
