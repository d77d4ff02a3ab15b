"""Cache rollback: after a partial acceptance, caches hold exactly the accepted tokens' state."""

from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache


class CacheRollback:
    """Rewinds a model's caches by the rejected tail of a verification.

    Key-value caches are trimmed. Caches that cannot be trimmed (the recurrent state of
    hybrid models) are refused with a clear error.
    """

    def __init__(self, cache: list[Any]):
        if not can_trim_prompt_cache(cache):
            kinds = sorted({type(c).__name__ for c in cache if not c.is_trimmable()})
            raise ValueError(
                f"speculative decoding needs caches that can roll back, but this model uses "
                f"{', '.join(kinds)}; use plain generation (no drafter) for this model"
            )
        self.cache = cache

    def before_verify(self, width: int) -> None:
        """Called before a verification of ``width`` tokens extends the caches."""

    def rewind(self, num_rejected: int) -> None:
        """Drop the state of the last ``num_rejected`` verified positions."""
        if num_rejected > 0:
            trim_prompt_cache(self.cache, num_rejected)
