"""One request of a batch: a single-request ``Generation`` whose decode steps ``BatchGeneration`` computes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
import numpy as np

from specbench.core.draft import Draft
from specbench.core.engine import Generation
from specbench.core.experts import ExpertCounter
from specbench.core.policies import Decision, DraftPolicy, Plain, Speculate
from specbench.core.target import Step
from specbench.core.verify import as_draft, cut_unconfident


@dataclass(frozen=True)
class RowPlan:
    """A row's plan for one batched step: draft length requested, paused, its checked draft (None: a plain row),
    draft seconds."""

    k: int = 0
    paused: bool = False
    draft: Draft | None = None
    draft_s: float = 0.0


class BatchRequest(Generation):
    """One request of a batch: a ``Generation`` (prompt checks, prefill, stops, finish reasons,
    step log) whose decode steps its ``BatchGeneration`` computes."""

    def __init__(self, index: int, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.target = self.target.inner  # the batch computes its steps (and pipelines them) itself
        self.index = index
        self.started = 0.0
        #: The policy's last decision (``Plain.n``: the plain steps a paused row asks for).
        self.decision: Decision = Plain(1)

    def __next__(self) -> int:
        raise TypeError("a batched request is decoded by its BatchGeneration: iterate that, or call its run()")

    @property
    def finished(self) -> bool:
        return self._finish is not None

    def begin(self, counter: ExpertCounter | None) -> None:
        """Seed, start the policy, and run the prompt pass alone (mlx-lm's single-request cache)."""
        self.started = self.clock()
        if self.options.seed is not None:
            mx.random.seed(self.options.seed)
        target = self.target
        target.sampler = self.options.sampling.sampler()
        target.counter = counter
        if self.drafter is not None:
            self.policy.start(self.drafter, self.break_even)
        for _ in self._prefill():
            pass
        self._check_finished()

    def decide(self, batch_size: int) -> RowPlan:
        """The policy's decision for this step (k requested, paused; no draft yet), before any step queued past the
        last one is read (so that step counts to this decision, as in a single request)."""
        if self.drafter is None:
            return RowPlan()
        cast(DraftPolicy, self.policy).set_batch_size(batch_size)
        self.decision = self.policy.decide(self.log, self.drafter)
        return RowPlan(self.decision.k) if isinstance(self.decision, Speculate) else RowPlan(paused=True)

    def plan(self, decision: RowPlan) -> RowPlan:
        """``decision`` with its checked draft (None: a plain row) and the seconds drafting took."""
        k = decision.k
        if k <= 0 or self._remaining() <= 1:
            return decision
        t0 = self.clock()
        name = self._drafter_name()
        draft = as_draft(self.drafter.draft(self.prompt + self.tokens, min(k, self._remaining() - 1)), k, name)
        if isinstance(self.decision, Speculate):
            draft = cut_unconfident(draft, self.decision.min_confidence)
        if draft.tokens:
            draft = self._checked(draft)
            if getattr(draft, "parents", None) is not None:
                raise ValueError(f"drafter {name} proposed a token tree: batched decoding verifies paths only")
        return RowPlan(k, False, draft if draft.tokens else None, self.clock() - t0)

    def sample_seed(self) -> None:
        """Seed the sampler for this request's next draws: from its own seed and step, so its output
        does not depend on which other requests share the batch (None: the global stream)."""
        if self.options.seed is not None:
            state = np.random.SeedSequence([self.options.seed, len(self.log)]).generate_state(1, np.uint64)[0]
            mx.random.seed(int(state))

    def settle(
        self,
        tokens: list[int],
        accepted: int,
        probs: list[float],
        hidden: mx.array | None,
        plan: RowPlan,
        verify_s: float,
        extra: dict[str, Any],
    ) -> list[int]:
        """Cut the step's tokens at this request's stops, log the step, emit; the emitted tokens."""
        position = len(self.tokens)
        emitted = self._stop_at(tokens)
        if plan.draft is None:
            self._record(
                "plain",
                position,
                emitted,
                k_requested=plan.k,
                draft_s=plan.draft_s,
                verify_s=verify_s,
                paused=plan.paused,
                extra=extra,
            )
        else:
            step = Step(tokens, None, extra, accepted, probs)
            self._record_verify(plan.k, plan.draft, step, emitted, draft_s=plan.draft_s, verify_s=verify_s)
        for _ in self._emit(emitted, hidden[:, : len(emitted)] if hidden is not None else None):
            pass
        self._check_finished()
        return emitted

    def _check_finished(self) -> None:
        if self._finish is not None:
            self._wall_s = self.clock() - self.started
            if self.drafter is not None:
                self.drafter.end()


__all__ = ["BatchRequest", "RowPlan"]
