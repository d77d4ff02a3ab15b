"""Distinct MoE experts a verification reads under uniform routing, and an MoE model's routing.

A verification of w tokens reads the weights of every expert any of its rows routes to. Under
uniform routing of top-K of E experts that is E (1 - (1 - K/E)^w) experts per layer (scripts/gpu/cost.py measures them).
"""

from __future__ import annotations

import mlx.nn as nn

from specbench.core.forward import text_model


def expected_distinct_experts(num_experts: int, top_k: int, width: int) -> float:
    """Expected distinct experts per layer for ``width`` tokens under uniform top-K routing."""
    if not 0 < top_k <= num_experts:
        raise ValueError(f"need 0 < top_k <= num_experts, got top_k={top_k}, num_experts={num_experts}")
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** width)


def routing(model: nn.Module) -> tuple[int, int]:
    """(num_experts, experts per token) of an MoE model."""
    args = getattr(text_model(model), "args", None)
    experts = getattr(args, "num_experts", None) or getattr(args, "n_routed_experts", None)
    top_k = getattr(args, "num_experts_per_tok", None)
    if not experts or not top_k:
        raise ValueError("this model has no num_experts / num_experts_per_tok in its args: is it an MoE model?")
    return int(experts), int(top_k)
