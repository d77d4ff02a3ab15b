"""Generation options: shared by plain and speculative decoding, checked before any model work."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from specbench.core.accept import SamplingSettings

#: "exact": every verified row computed as serial decoding computes it; "fast": one batched forward.
VerifyMode = Literal["exact", "fast"]
VERIFY_MODES: tuple[VerifyMode, ...] = get_args(VerifyMode)


def check_verify_mode(mode: object) -> VerifyMode:
    """``mode`` if it is a verify mode, else one clear ValueError."""
    if mode not in VERIFY_MODES:
        raise ValueError(f"verify mode must be one of {', '.join(VERIFY_MODES)}, got {mode!r}")
    return mode  # type: ignore[return-value]


@dataclass
class GenerateOptions:
    """Options shared by plain and speculative generation (mlx-lm's names where they exist).

    ``verify``: "exact" computes every row of a verification as serial decoding would (the
    default for greedy decoding), "fast" runs one batched forward (the default when sampling).
    ``count_experts``: record the distinct experts each MoE layer touches per step (in the log
    record's ``extra["experts"]``); off by default, and free when off.
    """

    max_tokens: int = 256
    stop_token_ids: Sequence[int] = ()
    stop_strings: Sequence[str] = ()
    eos_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    min_p: float = 0.0
    top_k: int = 0
    seed: int | None = None
    verify: VerifyMode | None = None
    prefill_step_size: int = 2048
    count_experts: bool = False

    def check(self) -> None:
        """Raise one clear ValueError for the first invalid option."""
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.verify is not None:
            check_verify_mode(self.verify)
        if self.prefill_step_size < 1:
            raise ValueError(f"prefill_step_size must be >= 1, got {self.prefill_step_size}")

    @property
    def sampling(self) -> SamplingSettings:
        return SamplingSettings(self.temperature, self.top_p, self.min_p, self.top_k)

    @property
    def verify_mode(self) -> VerifyMode:
        if self.verify is not None:
            return self.verify
        return "exact" if self.temperature == 0 else "fast"
