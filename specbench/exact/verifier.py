"""Exact verification: every row of a verify forward computed as serial decoding computes it.

Its plain steps run one-row products through the row-invariant kernels where the device measured them faster
(``specbench.exact.one_row``).

``exact_mode(model)`` runs forwards with the calibrated cheapest exact split per width;
``ExactVerifier`` is the decode loop's verifier in exact mode, and ``verifier_for`` picks the
verifier of a verify mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import mlx.nn as nn

from specbench.core.verify import FAST, Verifier, check_verify_mode
from specbench.exact.calibration import calibrate, calibrated_plans, load_calibration
from specbench.exact.hooks import Plans, SplitVerifier, split_mode
from specbench.exact.one_row import one_row_choice, one_row_kernels
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


class ExactVerifier(SplitVerifier):
    """Exact verification of one model: the split verifier (``SplitVerifier``: each verification inside
    ``exact_mode(model, level)``, each row's greedy choice made on its own, as a serial step makes it) at a fixed
    level, or at the calibrated cheapest exact level per width ("auto").

    ``widths`` calibrates those widths up front (so no verification pays for it later).
    """

    def __init__(
        self,
        model: nn.Module,
        level: str | ExactPlan = "auto",
        widths: Sequence[int] = (),
        progress: Callable[[str], None] | None = None,
    ):
        super().__init__(model, level if level == "auto" else ExactPlan.parse(level))
        self.prepare(widths, progress)

    def prepare(self, widths: Sequence[int], progress: Callable[[str], None] | None = None) -> list[int]:
        """Calibrate the ``widths`` not calibrated yet (at level "auto"), reporting through
        ``progress``, and choose the plain steps' one-row kernels (``one_row_choice``); returns the widths it
        calibrated."""
        one_row_choice(self.model)  # plain steps' kernels chosen now (timed once per process, on CUDA only)
        wanted = sorted({int(w) for w in widths if w > 1})
        if self.level != "auto" or not wanted:
            return []
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

    def decoding(self) -> contextlib.AbstractContextManager[list[str]]:
        """Around every generation: one-row products through the row-invariant kernels where they are faster on
        this device (``specbench.exact.one_row``; bit-identical to the model's own, so plain greedy is unchanged)."""
        return one_row_kernels(self.model)

    def level_for(self, width: int) -> str:
        """The level a verification of ``width`` tokens runs at."""
        if self.level != "auto":
            return self.level.name
        return calibrated_plans(self.model)(width).name

    def plans_of(self, model: nn.Module) -> Plans:
        """The calibrated plans per width (the calibration read once) at level "auto", else the level."""
        return calibrated_plans(model) if self.level == "auto" else self.level


def verifier_for(
    model: nn.Module, verify: str, widths: Sequence[int] = (), progress: Callable[[str], None] | None = None
) -> Verifier:
    """The verifier of verify mode ``verify`` ("fast" or "exact") for ``model``; in exact mode with
    ``widths`` calibrated up front (see ``ExactVerifier.prepare``)."""
    if check_verify_mode(verify) == "exact":
        return ExactVerifier(model, widths=widths, progress=progress)
    return FAST
