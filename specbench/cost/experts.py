"""Distinct MoE experts a verification reads, measured and under uniform routing.

A verification of w tokens reads the weights of every expert any of its rows routes to. Under
uniform routing of top-K of E experts that is E (1 - (1 - K/E)^w) experts per layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specbench.core.experts import ExpertCounter
from specbench.core.forward import text_model, vocab_size
from specbench.cost.caches import CacheRestore, prefill


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


def expert_counts(
    model: nn.Module, widths: Sequence[int], offset: int = 128, trials: int = 4, seed: int = 0
) -> list[dict[str, float]]:
    """Distinct experts per layer touched by verifications of each width (random ids after a
    random ``offset``-token context), averaged over the layers the forward called and over
    ``trials``, with the uniform-routing expectation alongside."""
    num_experts, top_k = routing(model)
    rng = np.random.default_rng(seed)
    vocab = vocab_size(model)
    totals: dict[int, list[float]] = {w: [] for w in widths}
    with ExpertCounter(model) as counter:
        for _ in range(trials):
            cache = prefill(model, rng.integers(0, vocab, size=offset).tolist())
            restore = CacheRestore(cache)
            counter.take()
            for w in widths:
                mx.eval(model(mx.array(rng.integers(0, vocab, size=w).tolist())[None], cache=cache))
                called = [c for c in counter.take() if c]  # an attached MTP head's experts are not called
                totals[w].append(float(np.mean(called)))
                restore()
    return [
        {
            "width": w,
            "distinct_experts": float(np.mean(totals[w])),
            "expected_uniform": expected_distinct_experts(num_experts, top_k, w),
            "num_experts": num_experts,
            "top_k": top_k,
        }
        for w in widths
    ]
