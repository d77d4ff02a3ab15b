"""What makes plain decoding fast around speculation: each plain step queued before the token before it is read.

``Pipeline`` wraps a target (``specbench.core.target``) for the decode loop. Within a stretch of plain steps it
queues step i + 1 before reading step i's token, as mlx-lm's ``generate_step`` does; past a stretch that more
tokens follow it queues one more step and keeps it (the next stretch goes on from it, so the pipeline never
drains between stretches; a draft takes its token first, through ``ready``). A probe (``Speculate.probing``: a
verification expected to be rejected) has the plain step after a full rejection queued while it verifies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import mlx.core as mx

from specbench.core.draft import Draft
from specbench.core.target import Step, Target


class Pipeline:
    """``target`` with its plain steps pipelined, for a generation whose last output index is ``end - 1``."""

    def __init__(self, target: Target, end: int):
        self.inner = target
        self.end = end
        self.vocab: int | None = target.vocab
        self.context_limit: int | None = target.context_limit
        self.stop_index: int | None = target.stop_index
        #: The plain step queued past the last stretch and its output position.
        self._ahead: tuple[Any, int] | None = None

    def running(self) -> contextlib.AbstractContextManager[Any]:
        return self.inner.running()

    def prefill(self, prompt: list[int], cached: int) -> tuple[Step, mx.array | None]:
        return self.inner.prefill(prompt, cached)

    def plain_steps(self, position: int, n: int) -> Iterator[Step]:
        """``n`` plain steps from output ``position``, each queued before the token before it is read; when
        tokens follow the last, the step after it is queued too and kept."""
        more = position + n < self.end
        if self._ahead is not None and self._ahead[1] == position:
            pending, self._ahead = self._ahead[0], None
        else:
            self._check_taken()
            pending = self.inner.queue(position)
        for i in range(n):
            current = pending
            if i + 1 < n or more:
                pending = self.inner.queue(position + i + 1)
            if i + 1 == n and more:
                self._ahead = (pending, position + n)
            yield self.inner.take(current)

    def ready(self) -> Step | None:
        """The plain step queued past the last stretch, read (None when none is): its token comes before a draft."""
        if self._ahead is None:
            return None
        (queued, _), self._ahead = self._ahead, None
        return self.inner.take(queued)

    def verify(self, draft: Draft, position: int, probing: bool = False) -> Step:
        """The target's verification of ``draft`` (a path or a token tree) after output ``position``; a probe's
        full rejection leaves the plain step after it queued."""
        self._check_taken()
        if draft.is_tree:
            return self.inner.verify(draft.tokens, draft.probs, position, parents=draft.parents)
        step = self.inner.verify(draft.tokens, draft.probs, position, queue_rejected=probing)
        if step.queued is not None:
            self._ahead = (step.queued, position + 1)
        return step

    def _check_taken(self) -> None:
        if self._ahead is not None:
            raise RuntimeError("a plain step is still queued past the last stretch: take its token with ready()")
