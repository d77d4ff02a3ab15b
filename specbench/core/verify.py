"""Verifiers: how a verification forward is computed, chosen once per generation.

The decode loop never asks which verify mode it runs in: it calls its verifier. ``Verifier``
itself is the fast mode (one batched forward, one argmax over the rows); the exact mode
(``specbench.exact.ExactVerifier``) computes every row as serial decoding would.
"""

from __future__ import annotations

import contextlib
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specbench.core.forward import forward, greedy
from specbench.core.options import VerifyMode


class Verifier:
    """Fast verification: one batched forward over the drafted tokens."""

    mode: VerifyMode = "fast"

    def running(self) -> contextlib.AbstractContextManager[None]:
        """Around one generation (what the verifier prepares once per generation)."""
        return contextlib.nullcontext()

    def forward(
        self, model: nn.Module, inputs: mx.array, cache: list[Any], return_hidden: bool = False
    ) -> mx.array | tuple[mx.array, mx.array]:
        """The verification forward of ``inputs`` ([1, w] ids), extending ``cache``."""
        return forward(model, inputs, cache, return_hidden)

    def greedy(self, logits: mx.array) -> list[int]:
        """The model's greedy choice at each row of ``logits`` ([w, vocab])."""
        return greedy(logits).tolist()

    def before_plain_step(self, cache: list[Any]) -> None:
        """Called before each plain decode step of a speculative generation."""

    def after_rewind(self, cache: list[Any], rejected: int) -> None:
        """Called after the caches dropped the ``rejected`` tokens of a verification."""


#: The fast verifier (stateless: one instance serves every generation).
FAST = Verifier()
