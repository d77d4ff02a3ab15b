"""vLLM's dynamic speculative decoding: the draft length keyed by batch size.

Source: vllm-project/vllm pull request #32374, "[V1][Spec Decode] Add Dynamic SD"
(https://github.com/vllm-project/vllm/pull/32374). ``speculative_config`` takes
``num_speculative_tokens_per_batch_size``, a map of inclusive batch-size ranges to K
(``{"1-16": 3, "64-128": 2, "256-4096": 0}``); a batch size in a gap inherits the previous range's K, and the
K scheduled is ``min(num_speculative_tokens, K)``. Here a range's start is its key (the lookup is
``BatchTablePolicy``'s: the entry of the largest start at most the batch size), ``max_k`` is
``num_speculative_tokens``, and a single request is a batch of 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specbench.core.batch_policies import BatchTablePolicy
from specbench.core.draft import Drafter
from specbench.core.policies import PEERS
from specbench.core.policy_args import check_k


class VllmTablePolicy(BatchTablePolicy):
    """K from vLLM's batch-size schedule, at most ``max_k`` (``num_speculative_tokens``)."""

    def __init__(self, table: Mapping[Any, int], max_k: int | None = None):
        super().__init__({_start(b): k for b, k in table.items()} if isinstance(table, Mapping) else table)
        self.max_k = check_k(max_k, "max_k") if max_k is not None else max(max(self.table.values()), 1)
        self.name = "vllm:" + ",".join(f"{b}={k}" for b, k in self.table.items())

    def k_at(self, batch_size: int) -> int:
        return min(super().k_at(batch_size), self.max_k)

    def longest_draft(self, drafter: Drafter | None) -> int:
        return self.max_k

    @classmethod
    def from_text(cls, text: str) -> VllmTablePolicy:
        """``1-16=3,64-128=2,256=0`` (ranges or their starts); empty: vLLM's example schedule."""
        if not text:
            return cls(EXAMPLE_SCHEDULE)
        try:
            table = {b.strip(): int(k) for b, k in (item.split("=") for item in text.split(","))}
        except ValueError:
            raise ValueError(f"vllm:{text}: use vllm:B=K,... with B a batch size or range (e.g. vllm:1-16=3)") from None
        return cls(table)


#: The schedule of vLLM's pull request: K = 3 up to 16 requests, 2 from 64, none from 256.
EXAMPLE_SCHEDULE = {"1-16": 3, "64-128": 2, "256-4096": 0}


def _start(batch_sizes: Any) -> int:
    """A range key's first batch size (``"1-16"`` -> 1), or the batch size itself."""
    text = str(batch_sizes).strip()
    try:
        return int(text.split("-", 1)[0])
    except ValueError:
        raise ValueError(f"a vLLM batch-size key is N or N-M, got {batch_sizes!r}") from None


PEERS.add("vllm", VllmTablePolicy)
