"""Drafters: what proposes tokens for verification."""

from __future__ import annotations

from typing import Any

from specbench.drafters.base import Draft, Drafter
from specbench.drafters.lookup import PromptLookup

DRAFTER_NAMES = ("lookup", "suffix", "mtp", "none")


def make_drafter(name: str, model: Any = None, model_name: str | None = None) -> Drafter | None:
    """A drafter by name: ``lookup``, ``suffix``, ``mtp`` (the model's MTP head) or ``none``."""
    key = name.strip().lower()
    if key in ("none", "plain", ""):
        return None
    if key == "lookup":
        return PromptLookup()
    if key == "suffix":
        from specbench.drafters.suffix import SuffixDecoding

        return SuffixDecoding()
    if key == "mtp":
        from specbench.drafters.mtp import mtp_drafter_for

        return mtp_drafter_for(model, model_name)
    raise ValueError(f"unknown drafter {name!r}: choose one of {', '.join(DRAFTER_NAMES)}")


def __getattr__(name: str):
    # Heavier drafters load on first use.
    if name == "SuffixDecoding":
        from specbench.drafters.suffix import SuffixDecoding

        return SuffixDecoding
    if name == "MtpDrafter":
        from specbench.drafters.mtp import MtpDrafter

        return MtpDrafter
    raise AttributeError(name)


__all__ = ["Draft", "Drafter", "PromptLookup", "SuffixDecoding", "MtpDrafter", "make_drafter", "DRAFTER_NAMES"]
