"""Drafters: what proposes tokens for verification."""

from .base import Draft, Drafter
from .lookup import PromptLookup
