"""SGLang's adaptive speculative decoding: EMA of the accepted length, tiers of draft steps per batch size.

Source: sgl-project/sglang, python/sglang/srt/speculative/adaptive_spec_params.py (``AdaptiveStepSlot``,
``DEFAULT_ADAPTIVE_CONFIG``; pull requests #21599 and #24055). Per batch-size slot: candidate steps (tiers),
an EMA of each verification's accepted drafts (``ema_alpha`` 0.2, started at the tier's steps - 1), and
after ``warmup_batches`` (10) a recomputation every ``update_interval`` (5) batches: step down while the EMA
is at most the lower tier - 0.5 + ``down_hysteresis`` (0.5 + it for the tier 0, which stops drafting), else
step up while it exceeds the tier - 0.5 + ``up_hysteresis``; from tier 0 the next tier is probed. Here a
batch is one decoding step of this request (a plain step counts one, as SGLang's batches at 0 steps do),
a draft of k tokens is SGLang's k steps (top-k 1), and a batch size takes the slot of the largest
configured size at most it (SGLang pads to a CUDA-graph size and takes the closest slot).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from specbench.core.draft import Drafter
from specbench.core.log import StepRecord
from specbench.core.policies import PEERS, DraftPolicy
from specbench.core.policy_args import MAX_DRAFT_LENGTH, real, whole

#: SGLang's default tiers per batch size (``DEFAULT_ADAPTIVE_CONFIG``).
DEFAULT_TIERS: dict[int, tuple[int, ...]] = {1: (1, 3, 5, 7), 8: (0, 1, 3), 32: (0, 1), 64: (0,)}
#: SGLang's default down-hysteresis per slot (-0.25 at batch size 1, 0 elsewhere).
DEFAULT_DOWN = {1: -0.25}


def check_tiers(tiers: Iterable[int]) -> tuple[int, ...]:
    """A slot's tiers if each is a draft length from 0 (no drafting) to ``MAX_DRAFT_LENGTH``, else one clear error."""
    if isinstance(tiers, (str, bytes)) or not isinstance(tiers, Iterable):
        raise TypeError(f"an SGLang slot's tiers are a sequence of draft lengths, e.g. (1, 3, 5, 7), got {tiers!r}")
    checked = tuple(whole("an SGLang tier", t, 0, MAX_DRAFT_LENGTH) for t in tiers)
    if not checked:
        raise ValueError("an SGLang slot needs at least one tier (draft steps, 0 = no drafting)")
    return checked


class SglangTier:
    """One batch-size slot: its tiers, the EMA of accepted drafts and the current tier."""

    def __init__(self, tiers: Sequence[int], initial: int | None, down: float, up: float):
        self.tiers = sorted(set(check_tiers(tiers)))
        self.down, self.up = down, up
        self.steps = initial if initial in self.tiers else self.tiers[len(self.tiers) // 2]
        self.ema = float(self.steps - 1)
        self.batches = 0

    def update(self, accepted: int | None, alpha: float, warmup: int, interval: int) -> None:
        """One batch: ``accepted`` drafts of a verification (None: a plain step); maybe a new tier."""
        if self.steps > 0 and accepted is not None:
            self.ema = (1 - alpha) * self.ema + alpha * accepted
        self.batches += 1
        if self.batches > warmup and (self.batches - warmup) % interval == 0:
            self.steps = self._target()

    def _target(self) -> int:
        i = self.tiers.index(self.steps)
        if self.steps == 0:
            target = self.tiers[min(i + 1, len(self.tiers) - 1)]
            if target > 0 and self.ema < 0:
                self.ema = float(target - 1)
            return target
        start = i
        while i > 0 and self.ema <= (0.5 if self.tiers[i - 1] == 0 else self.tiers[i - 1] - 0.5) + self.down:
            i -= 1
        if i == start:
            while i < len(self.tiers) - 1 and self.ema > self.tiers[i] - 0.5 + self.up:
                i += 1
        return self.tiers[i]

    def plain_until_update(self, warmup: int, interval: int) -> int:
        """Batches until this slot next recomputes its tier (plain steps while at tier 0)."""
        if self.batches < warmup:
            return warmup - self.batches + interval
        return interval - (self.batches - warmup) % interval


class SglangEmaPolicy(DraftPolicy):
    """SGLang's EMA-adaptive tiers: ``tiers`` maps a batch size to its candidate draft lengths."""

    def __init__(
        self,
        tiers: Mapping[int, Sequence[int]] | None = None,
        initial: int | None = None,
        ema_alpha: float = 0.2,
        update_interval: int = 5,
        warmup_batches: int = 10,
        up_hysteresis: float = 0.0,
        down_hysteresis: Mapping[int, float] | float | None = None,
    ):
        self.tiers = {whole("a batch size", b, 1): check_tiers(t) for b, t in (tiers or DEFAULT_TIERS).items()}
        if 1 not in self.tiers:
            raise ValueError(f"SGLang tiers {self.tiers} have no slot for batch size 1: start them at 1")
        self.initial = initial
        self.alpha = real("ema_alpha", ema_alpha, 0.0, 1.0)
        self.interval = whole("update_interval", update_interval, 1)
        self.warmup = whole("warmup_batches", warmup_batches, 0)
        self.up = real("up_hysteresis", up_hysteresis)
        down = DEFAULT_DOWN if down_hysteresis is None else down_hysteresis
        self.down: Callable[[int], float] = (
            (lambda b: float(down.get(b, 0.0))) if isinstance(down, Mapping) else (lambda b: real("down", down))
        )
        custom = self.tiers != DEFAULT_TIERS and list(self.tiers) == [1]
        self.name = "sglang:" + ",".join(map(str, self.tiers[1])) if custom else "sglang"

    def start(self, drafter: Drafter, break_even: Callable[[int], float] | None = None) -> None:
        super().start(drafter, break_even)
        self.slots = {b: SglangTier(t, self.initial, self.down(b), self.up) for b, t in self.tiers.items()}

    @property
    def slot(self) -> SglangTier:
        return self.slots[max(b for b in self.slots if b <= self.batch_size)]

    def _observe(self, record: StepRecord) -> None:
        if record.kind == "prefill":
            return
        accepted = record.accepted if record.kind == "verify" else None
        self.slot.update(accepted, self.alpha, self.warmup, self.interval)

    def _k(self, drafter: Drafter) -> int:
        return self.slot.steps

    def _plain_run(self) -> int:
        return self.slot.plain_until_update(self.warmup, self.interval)

    def longest_draft(self, drafter: Drafter | None) -> int:
        return max(1, max(max(t) for t in self.tiers.values()))

    @classmethod
    def from_text(cls, text: str) -> SglangEmaPolicy:
        """``sglang`` (SGLang's default tiers) or ``sglang:1,3,5,7`` (the tiers at every batch size)."""
        if not text:
            return cls()
        try:
            tiers = [int(t) for t in text.split(",")]
        except ValueError:
            raise ValueError(f"sglang:{text}: use sglang or sglang:T1,T2,... (draft lengths, 0 = none)") from None
        return cls({1: tiers})


PEERS.add("sglang", SglangEmaPolicy)
