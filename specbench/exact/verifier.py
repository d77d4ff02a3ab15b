"""Exact verification: every row of a verify forward computed as serial decoding computes it.

``exact_mode(model)`` runs forwards with the calibrated cheapest exact split per width;
``ExactVerifier`` is the decode loop's verifier in exact mode, and ``verifier_for`` picks the
verifier of a verify mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from specbench.core.forward import forward, greedy
from specbench.core.options import VerifyMode, check_verify_mode
from specbench.core.verify import FAST, Verifier
from specbench.exact.calibration import calibrate, calibrated_plans, load_calibration
from specbench.exact.hooks import Plans, split_mode
from specbench.exact.layout import clear_rejected, layout_sensitive_attention, serial_kv_layout
from specbench.exact.plan import ExactPlan


def exact_mode(
    model: nn.Module, level: str | ExactPlan = "auto", compiled: bool = False
) -> contextlib.AbstractContextManager[None]:
    """Inside, a forward of ``model`` of width w computes each row as serial decoding would.

    ``level``: "auto" (the calibrated cheapest exact level per width, see ``calibrate``), or a
    fixed level for every width: "none", "attention", "attention+linear", "all", "serial", or a
    combination such as "attention+linear/4+experts/unsorted" (see ``ExactPlan.parse``).
    Entering is cheap (a few attribute swaps): enter it around each verification. ``compiled``:
    linear layers split in chunks run through ``mx.compile``d functions (``split_mode``).
    """
    return split_mode(model, calibrated_plans(model) if level == "auto" else level, compiled)


class ExactVerifier(Verifier):
    """Exact verification of one model: each verification runs inside ``exact_mode(model, level)``,
    and each row's greedy choice is made on its own, as a serial step makes it.

    ``widths`` calibrates those widths up front (so no verification pays for it later). Where
    attention depends on the KV buffer's layout (``layout_sensitive_attention``, checked once
    here), plain steps get serial decoding's buffer and rejected rows are zeroed after a rewind.
    """

    mode: VerifyMode = "exact"

    def __init__(
        self,
        model: nn.Module,
        level: str | ExactPlan = "auto",
        widths: Sequence[int] = (),
        progress: Callable[[str], None] | None = None,
    ):
        self.model = model
        self.level = level if level == "auto" else ExactPlan.parse(level)
        self.clears_rejected = layout_sensitive_attention()
        self._laid_out: list[Any] | None = None  # the cache last given serial decoding's layout
        self._plans: Plans | None = None  # the generation's, while one runs
        self.prepare(widths, progress)

    def prepare(self, widths: Sequence[int], progress: Callable[[str], None] | None = None) -> list[int]:
        """Calibrate the ``widths`` not calibrated yet (at level "auto"), reporting through
        ``progress``; returns those it calibrated."""
        if self.level != "auto":
            return []
        wanted = sorted({int(w) for w in widths if w > 1})
        stored = load_calibration(self.model)
        missing = [w for w in wanted if stored is None or w not in stored.widths]
        if missing:
            if progress is not None:
                progress(
                    f"calibrating exact verification for widths {missing[0]}..{missing[-1]} "
                    "(once per model and device; stored for later runs)"
                )
            calibrate(self.model, missing, progress=progress)
        return missing

    def level_for(self, width: int) -> str:
        """The level a verification of ``width`` tokens runs at."""
        if self.level != "auto":
            return self.level.name
        return calibrated_plans(self.model)(width).name

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """One generation: its plans per width prepared once (the calibration read once), used by every
        verification in it."""
        self._plans = calibrated_plans(self.model) if self.level == "auto" else self.level
        try:
            yield
        finally:
            self._plans = None

    def forward(
        self, model: nn.Module, inputs: mx.array, cache: list[Any], return_hidden: bool = False
    ) -> mx.array | tuple[mx.array, mx.array]:
        self._laid_out = None
        # The split's class patches go in around each verification, not once per generation: in and out they
        # cost ~0.2 ms a verification, while left in for a generation their wrappers add ~0.9 ms to every plain
        # step (SmolLM2-135M on a CPU, building each step's graph), and speculation takes plain steps too.
        plans = self._plans if self._plans is not None and model is self.model else None
        with split_mode(model, plans) if plans is not None else exact_mode(model, self.level):
            return forward(model, inputs, cache, return_hidden)

    def greedy(self, logits: mx.array) -> list[int]:
        return mx.concatenate([greedy(logits[i : i + 1]) for i in range(logits.shape[0])]).tolist()

    def before_plain_step(self, cache: list[Any]) -> None:
        # Once laid out, plain steps grow the buffers as serial decoding does: only a verification moves them.
        if self._laid_out is not cache:
            serial_kv_layout(cache, 1)
            self._laid_out = cache

    def after_rewind(self, cache: list[Any], rejected: int) -> None:
        self._laid_out = None
        if self.clears_rejected:
            clear_rejected(cache, rejected)


def verifier_for(
    model: nn.Module, mode: str, widths: Sequence[int] = (), progress: Callable[[str], None] | None = None
) -> Verifier:
    """The verifier of verify mode ``mode`` ("fast" or "exact") for ``model``; in exact mode with
    ``widths`` calibrated up front (see ``ExactVerifier.prepare``)."""
    if check_verify_mode(mode) == "exact":
        return ExactVerifier(model, widths=widths, progress=progress)
    return FAST
