"""Exact levels: which layers a verify forward runs row by row, and how many rows per call.

- ``attention``: row i runs as one query over the cache prefix it sees in serial decoding
  (keys ``[:offset + i + 1]``, no mask), through ``mx.fast.scaled_dot_product_attention`` (or
  mlx-lm's quantized-cache attention); ``attention/kernel``: every row in one call of
  ``specbench.kernels.attention_rows``, each row as that one-query call computes it, where the device's
  probe proved it (quantized caches, token trees and array masks stay row by row);
- ``linear``: ``nn.Linear``, ``nn.QuantizedLinear``, ``nn.QQLinear`` and tied output
  embeddings (``as_linear``) take 1 row per call (``linear/c``: c rows per call, exact where the
  device's kernel for up to c rows is row-invariant; ``linear/vector``: one batched call of
  w single-row products, for kernels that run each batch entry as a matrix-vector product;
  ``linear/kernel``: quantized layers through ``specbench.kernels.qmv_rows``, every row as MLX's
  one-row product in one call, where the device's probe proved it; other layers row by row);
- ``experts``: MoE expert products (``SwitchGLU``, ``SwitchMLP``) take 1 token per call
  (``experts/unsorted``: as many tokens per call as mlx-lm routes without sorting them, which
  keeps its per-token gather kernels);
- ``serial``: w single-token forwards (exact by construction, for models with other
  row-dependent layers);
- ``compiled``: linear layers in chunks (``linear/c``, c >= 2) run each layer's chunks through
  one ``mx.compile``d function (the same products, fewer graph nodes).

Levels join parts with "+", e.g. ``"attention+linear/4+experts/unsorted+compiled"``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

#: Named levels, from no splitting to serial steps.
LEVELS = ("none", "attention", "attention+linear", "all", "serial")
_ALIASES = {"all": "attention+linear+experts", "": "none"}


@dataclass(frozen=True)
class ExactPlan:
    """Which layers a verify forward runs row by row, and how many rows per call.

    ``attention``: False (one batched call), True (row by row) or "kernel". ``linear`` / ``experts``:
    None (one batched call), an int (rows per call; 1 = row by row), or "vector" / "kernel" / "unsorted"
    (see the module docstring). ``compiled``: linear chunks through ``mx.compile`` (only with ``linear``
    an int >= 2).
    """

    attention: bool | str = False
    linear: int | str | None = None
    experts: int | str | None = None
    serial: bool = False
    compiled: bool = False

    def __post_init__(self) -> None:
        if self.compiled and not (isinstance(self.linear, int) and self.linear > 1):
            raise ValueError(
                f"exact level {self.name!r}: 'compiled' compiles linear layers split in chunks, so it needs "
                "'linear/c' with c >= 2 rows per call: add one (e.g. 'attention+linear/4+compiled') or drop 'compiled'"
            )

    @classmethod
    def parse(cls, level: str | ExactPlan) -> ExactPlan:
        """Parse a level such as ``"attention+linear/4+experts/unsorted"``, ``"all"``, ``"serial"``."""
        if isinstance(level, ExactPlan):
            return level
        if not isinstance(level, str):
            raise ValueError(f"an exact level is a string such as 'attention+linear', got {level!r}")
        return _parse_text(level)

    @property
    def name(self) -> str:
        """The level's canonical text (``ExactPlan.parse(plan.name) == plan``)."""
        if self.serial:
            return "serial"
        parts = ["attention/kernel"] if self.attention == "kernel" else ["attention"] if self.attention else []
        for key in ("linear", "experts"):
            value = getattr(self, key)
            if value is not None:
                parts.append(key if value == 1 else f"{key}/{value}")
        if self.compiled:
            parts.append("compiled")
        return "+".join(parts) or "none"

    def __str__(self) -> str:
        return self.name

    @property
    def uses_kernel(self) -> bool:
        """Whether a part runs through ``specbench.kernels`` (``linear/kernel``, ``attention/kernel``)."""
        return self.linear == "kernel" or self.attention == "kernel"

    @property
    def chunked(self) -> bool:
        """Whether linear layers run in chunks of c >= 2 rows (``linear/c``)."""
        return isinstance(self.linear, int) and self.linear > 1

    def scheme(self, family: str) -> str:
        """How this plan runs one op family ("attention", "linear", "experts"): "batched", "split" or "kernel"
        (attention), or the family's part as the level writes it (``linear/4``, ``experts/unsorted``)."""
        if family == "attention":
            return "kernel" if self.attention == "kernel" else "split" if self.attention else "batched"
        value = getattr(self, family)
        return "batched" if value is None else family if value == 1 else f"{family}/{value}"


@functools.lru_cache(maxsize=256)
def _parse_text(level: str) -> ExactPlan:
    text = _ALIASES.get(level.strip(), level.strip())
    if text == "none":
        return ExactPlan()
    if text == "serial":
        return ExactPlan(attention=True, linear=1, experts=1, serial=True)
    parts: dict[str, Any] = {}
    for part in text.split("+"):
        name, _, arg = part.partition("/")
        if name in ("attention", "compiled") and not arg:
            parts[name] = True
        elif name == "attention" and arg == "kernel":
            parts[name] = "kernel"
        elif name in ("linear", "experts"):
            special = ("vector", "kernel") if name == "linear" else ("unsorted",)
            if not arg:
                parts[name] = 1
            elif arg in special:
                parts[name] = arg
            elif arg.isdigit() and int(arg) >= 1:
                parts[name] = int(arg)
            else:
                raise ValueError(
                    f"bad rows per call {arg!r} in exact level {level!r}: use an integer >= 1 or one of {special}"
                )
        else:
            raise ValueError(
                f"unknown part {part!r} in exact level {level!r}: levels join 'attention[/kernel]', "
                "'linear[/c|/vector|/kernel]', 'experts[/c|/unsorted]' and 'compiled' with '+', or are one of "
                f"{LEVELS}"
            )
    return ExactPlan(**parts)
