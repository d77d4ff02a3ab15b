"""Cost profiles of a model sharded over ranks: one profile, the same on every rank.

A sharded model's forwards need every rank, so a profile is measured by all ranks together, with
fixed counts of forwards (``measure``): the time-budgeted ``quick_profile`` lets each rank's clock
decide how many forwards it runs, and ranks that disagree would wait on each other forever. Rank 0's
figures are then broadcast, so that every rank plans with the same break-even. The profile's key
(``model_key``) carries the group size and backend: c(w) includes the sharded layers' all-reduces.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.nn as nn

from specbench.common import distributed
from specbench.common.identity import display_name
from specbench.core.verify import check_verify_mode
from specbench.cost.measure import _MEMORY, QUICK_WIDTHS, _remember, measure
from specbench.cost.profile import Profile, load_profile


def lockstep_profile(
    model: nn.Module, verify: str = "fast", progress: Callable[[str], None] | None = None, repeats: int = 3
) -> Profile:
    """The profile to plan with, the same on every rank: rank 0's stored profile of this sharded
    model when it has one with ``verify`` costs, else a short one measured by all ranks together
    (widths 1, 2, 3, 5, 9; ``repeats`` rounds after one warm-up), rank 0's figures on every rank.
    Kept in memory per model object beside ``profile_for``'s (``forget`` drops it). In a world of one it is
    the same short measurement."""
    verify = check_verify_mode(verify)
    cached = _MEMORY.get((id(model), verify))
    if cached is not None:
        return cached
    stored = load_profile(model) if distributed.is_main() else None
    usable = stored is not None and verify in stored.costs
    data = distributed.broadcast({**stored.to_dict(), "source": stored.source} if usable else None)
    if data is None:
        if progress is not None and distributed.is_main():
            progress(
                f"measuring the {verify} verify cost of {display_name(model)} on {distributed.size()} ranks "
                f"({distributed.backend()}): none stored for it; `specbench profile --shard` stores a full one"
            )
        measured = measure(
            model,
            widths=list(QUICK_WIDTHS),
            verify=(verify,),
            offset=16,
            repeats=repeats,
            warmup=1,
            plain_tokens=4,
            overhead_widths=(5,),
        )
        data = distributed.broadcast(measured.to_dict())
    profile = Profile.from_dict(data)
    _remember(model, verify, profile)
    return profile
