"""Drafters: what proposes tokens for verification (the protocol is ``specbench.core.draft``)."""

from __future__ import annotations

from typing import Any

from specbench.core.draft import Draft, Drafter
from specbench.drafters.draft_model import DraftModel, has_shipped_draft_model, shipped_draft_model
from specbench.drafters.early_exit import EarlyExit, best_exit_layer, exit_layer_count, sweep_exit_layers
from specbench.drafters.lookup import PromptLookup
from specbench.drafters.mtp import MtpHead, mtp_head_for
from specbench.drafters.oracle import Oracle
from specbench.drafters.suffix import SuffixDecoding

DRAFTER_NAMES = ("lookup", "suffix", "mtp", "draft-model", "early-exit", "none")
#: Drafters that take a parameter after a colon: ``early-exit:L`` (exit after L layers), ``suffix:K`` (drafts of up
#: to K tokens; ``suffix`` alone: SuffixDecoding's default, 16).
PARAMETRIZED_DRAFTERS = ("early-exit", "suffix")


def is_drafter_name(name: str) -> bool:
    """Whether ``name`` names a drafter (``early-exit:L`` and ``suffix:K`` included, L and K positive integers)."""
    key = name.strip().lower()
    base, colon, value = key.partition(":")
    if colon:
        return base in PARAMETRIZED_DRAFTERS and value.isdigit() and int(value) >= 1
    return key in (*DRAFTER_NAMES, "plain", "")


def make_drafter(
    name: str, model: Any = None, model_name: str | None = None, draft_model: Any = None
) -> Drafter | None:
    """A drafter by name: ``lookup``, ``suffix``, ``mtp`` (the model's MTP head), ``draft-model``
    (``draft_model``, else the draft model shipped for ``model_name``), ``early-exit`` (half the
    layers) or ``early-exit:L`` (the first L layers), ``suffix:K`` (SuffixDecoding's drafts capped at K tokens:
    Auto then verifies, and exact mode calibrates, widths up to K + 1 only), or ``none``. ``model_name``
    defaults to the name the model was loaded by (``specbench.models.load``), so that an embedded model's
    shipped MTP head and draft model are found wherever it is passed without its name."""
    key = name.strip().lower()
    model_name = model_name or getattr(model, "specbench_name", None)
    if not is_drafter_name(key):
        raise ValueError(
            f"unknown drafter {name!r}: choose one of {', '.join(DRAFTER_NAMES)} (or early-exit:L, suffix:K with L and "
            "K positive integers)"
        )
    base, _, value = key.partition(":")
    if base in ("none", "plain", ""):
        return None
    if base == "lookup":
        return PromptLookup()
    if base == "suffix":
        if not value:
            return SuffixDecoding()
        drafter = SuffixDecoding(max_spec_tokens=int(value))
        drafter.name = key
        return drafter
    if base == "mtp":
        return mtp_head_for(model, model_name)
    if model is None:
        raise ValueError(f"drafter {name!r} needs the target model: pass model=")
    if base == "early-exit":
        return EarlyExit(model, int(value) if value else max(1, exit_layer_count(model) // 2))
    if draft_model is None:
        draft_model = shipped_draft_model(model, model_name)
    return DraftModel(draft_model, target=model)


__all__ = [
    "DRAFTER_NAMES",
    "Draft",
    "DraftModel",
    "Drafter",
    "EarlyExit",
    "MtpHead",
    "Oracle",
    "PromptLookup",
    "SuffixDecoding",
    "best_exit_layer",
    "has_shipped_draft_model",
    "is_drafter_name",
    "make_drafter",
    "shipped_draft_model",
    "sweep_exit_layers",
]
