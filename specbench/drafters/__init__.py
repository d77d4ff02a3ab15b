"""Drafters: what proposes tokens for verification (the protocol is ``specbench.core.draft``)."""

from __future__ import annotations

from typing import Any

from specbench.core.draft import Draft, Drafter
from specbench.drafters.lookup import PromptLookup
from specbench.drafters.mtp import MtpDrafter, mtp_drafter_for
from specbench.drafters.oracle import OracleDrafter
from specbench.drafters.suffix import SuffixDecoding

DRAFTER_NAMES = ("lookup", "suffix", "mtp", "none")


def make_drafter(name: str, model: Any = None, model_name: str | None = None) -> Drafter | None:
    """A drafter by name: ``lookup``, ``suffix``, ``mtp`` (the model's MTP head) or ``none``."""
    key = name.strip().lower()
    if key in ("none", "plain", ""):
        return None
    if key == "lookup":
        return PromptLookup()
    if key == "suffix":
        return SuffixDecoding()
    if key == "mtp":
        return mtp_drafter_for(model, model_name)
    raise ValueError(f"unknown drafter {name!r}: choose one of {', '.join(DRAFTER_NAMES)}")


__all__ = [
    "DRAFTER_NAMES",
    "Draft",
    "Drafter",
    "MtpDrafter",
    "OracleDrafter",
    "PromptLookup",
    "SuffixDecoding",
    "make_drafter",
]
