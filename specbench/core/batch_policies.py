"""Draft-length policies that look at the batch size (``set_batch_size``, before every batched step)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from specbench.core.auto import CostEnvelope
from specbench.core.draft import Drafter
from specbench.core.policies import AutoPolicy, DraftPolicy
from specbench.core.policy_args import check_k, whole


def _table(table: Mapping[int, int]) -> dict[int, int]:
    if not isinstance(table, Mapping) or not table:
        raise TypeError(f"a batch table maps batch sizes to draft lengths, e.g. {{1: 4, 8: 2, 32: 0}}, got {table!r}")
    out = {}
    for b, k in table.items():
        length = f"batch table {table!r}: draft length"
        out[whole(f"batch table {table!r}: batch size", b, 1)] = whole(length, k, 0) and check_k(k, length)
    if 1 not in out:
        raise ValueError(f"batch table {table!r} has no entry for batch size 1: start it at 1")
    return dict(sorted(out.items()))


class BatchTablePolicy(DraftPolicy):
    """k from a table keyed by batch size: the entry of the largest size <= the current batch."""

    def __init__(self, table: Mapping[int, int]):
        self.table = _table(table)
        self.name = "table:" + ",".join(f"{b}={k}" for b, k in self.table.items())

    def k_at(self, batch_size: int) -> int:
        return next(k for b, k in reversed(self.table.items()) if b <= batch_size)

    def _k(self, drafter: Drafter) -> int:
        return self.k_at(self.batch_size)

    def longest_draft(self, drafter: Drafter | None) -> int:
        return max(1, max(self.table.values()))


class BatchAutoPolicy(AutoPolicy):
    """Auto with the break-even at the current batch size: ``break_even_at(k, B)`` gives the tokens a
    verification of k drafts must yield in a batch of B. At each batch size the draft lengths come
    from that size's cost envelope (none: decode plainly while the batch is this large), and the kill
    switch costs verifications at the batch size they ran at. Auto's own timings are per request:
    the seconds between its decisions are one batched step each."""

    name = "auto-batch"

    def __init__(
        self,
        break_even_at: Callable[[int, int], float],
        max_k: int | None = None,
        window: int = 16,
        pause_tokens: int = 64,
        **kwargs: Any,
    ):
        if not callable(break_even_at):
            raise TypeError(f"break_even_at must be a function (k, batch size) -> tokens, got {break_even_at!r}")
        super().__init__(max_k, window, pause_tokens, None, **kwargs)
        self.break_even_at = break_even_at
        self.batch_size = 1

    @property
    def needs_break_even(self) -> bool:
        return False

    def start(self, drafter: Drafter, break_even: Callable[[int], float] | None = None) -> None:
        self.drafter = drafter
        self.batch_size = 1
        super().start(drafter, self._at(1))

    def _at(self, batch_size: int) -> Callable[[int], float]:
        return lambda k: self.break_even_at(k, batch_size)

    def set_batch_size(self, batch_size: int) -> None:
        """Plan with the break-even at ``batch_size``: the cost envelope and the draft length are
        recomputed from it (an empty envelope: plain decoding at this batch size)."""
        if batch_size == self.batch_size:
            return
        self.batch_size = batch_size
        self.plan(CostEnvelope(self._at(batch_size), self.longest_draft(self.drafter)), self.drafter)


__all__ = ["BatchAutoPolicy", "BatchTablePolicy"]
