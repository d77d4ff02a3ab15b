"""Exact verification: every row of a verify forward computed as serial decoding computes it.

Its plain steps run one-row products through the row-invariant kernels where the device measured them faster
(``specbench.exact.one_row``).

``exact_mode(model)`` runs forwards with the calibrated cheapest exact split per width;
``ExactVerifier`` is the decode loop's verifier in exact mode, ``FastVerifier`` fast mode's where the kernels run
(the exact split at the widths where it is cheaper), and ``verifier_for`` picks the verifier of a verify mode.
"""

from __future__ import annotations

import contextlib
import random
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specbench.core.forward import context_length
from specbench.core.tree import tree_forward
from specbench.core.verify import FAST, Verifier, check_verify_mode, forward
from specbench.exact.audit import (
    AuditResult,
    can_audit,
    check_audit_rate,
    first_divergence,
    rewind,
    serial_forward,
)
from specbench.exact.calibration import (
    DEFAULT_CONTEXT,
    CalibratedPlans,
    calibrate,
    calibrated_plans,
    lengths_for,
    load_calibration,
    uncovered,
    uses_kernel,
)
from specbench.exact.hooks import Plans, SplitVerifier, split_mode
from specbench.exact.layout import CUDNN_ATTENTION_ENV, cache_length, layout_sensitive_attention
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

    ``widths`` calibrates those widths up front (so no verification pays for it later), at the cache lengths a
    generation of ``context`` tokens reaches. At "auto" a verification whose cache is longer than its width's
    calibration reached (``WidthCalibration.reach``) calibrates that width that far first (stored: once per model
    and device), or runs as serial steps where the model's context leaves no room to probe it.
    ``audit``: the share of verifications compared with serial steps during a generation
    (``specbench.exact.audit``): on a mismatch the generation goes on from the serial steps and verifies serially
    from then on, warns once and names the first diverging operation (``audit_result()``); ``seed`` picks which.
    """

    def __init__(
        self,
        model: nn.Module,
        level: str | ExactPlan = "auto",
        widths: Sequence[int] = (),
        progress: Callable[[str], None] | None = None,
        audit: float = 0.0,
        seed: int | None = None,
        context: int | None = None,
    ):
        super().__init__(model, level if level == "auto" else ExactPlan.parse(level))
        self.audit_rate = check_audit_rate(audit)
        self.seed = seed
        self.audit = AuditResult(self.audit_rate)
        self._sampler = random.Random(seed)
        self.prepare(widths, progress, context)

    def prepare(
        self, widths: Sequence[int], progress: Callable[[str], None] | None = None, context: int | None = None
    ) -> list[int]:
        """Calibrate the ``widths`` not calibrated yet (at level "auto") at the cache lengths a generation of
        ``context`` tokens reaches (``lengths_for``; default ``DEFAULT_CONTEXT``), reporting through
        ``progress``, and choose the plain steps' one-row kernels (``one_row_choice``); returns the widths it
        calibrated."""
        one_row_choice(self.model)  # plain steps' kernels chosen now (timed once per process, on CUDA only)
        wanted = sorted({int(w) for w in widths if w > 1})
        if self.level != "auto" or not wanted:
            return []
        lengths = lengths_for(context or DEFAULT_CONTEXT, context_length(self.model))
        missing = uncovered(self.model, wanted, lengths)
        if missing:
            if progress is not None:
                progress(
                    f"calibrating exact verification for widths {missing[0]}..{missing[-1]} at cache lengths "
                    f"{', '.join(map(str, lengths))} (once per model and device; stored for later runs)"
                )
            calibrate(self.model, missing, lengths=lengths, progress=progress)
        return missing

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """One generation: its plans prepared once, and a fresh audit (the same verifications sampled for a seed)."""
        self.audit = AuditResult(self.audit_rate)
        self._sampler = random.Random(self.seed)
        with super().running():
            yield

    def forward(
        self, model: nn.Module, inputs: mx.array, cache: list[Any], return_hidden: bool = False
    ) -> mx.array | tuple[mx.array, mx.array]:
        if model is not self.model:
            return super().forward(model, inputs, cache, return_hidden)
        self._laid_out = None
        width = inputs.shape[1]
        plans = self._plans if self._plans is not None else self.plans_of(model)
        audit = self.audit
        audit.verifications += 1
        serial = audit.fell_back_at is not None
        if not serial and isinstance(plans, CalibratedPlans) and width > 1:
            length = cache_length(cache)
            if plans.reaches.get(width, -1) < length:  # past what was probed: calibrated that far first
                before = plans.calibrated
                if not plans.covers(width, length):  # where it cannot be: serial steps
                    serial = True
                    audit.beyond_reach += 1
                audit.calibrated += plans.calibrated - before
        audited = (
            not serial
            and width > 1
            and audit.rate > 0
            and not tree_forward(width)
            and can_audit(cache)
            and self._sampler.random() < audit.rate
        )
        # a calibrated width's plan is a dict lookup (CalibratedPlans.__missing__ calibrates one not seen yet)
        resolve = plans.__getitem__ if isinstance(plans, CalibratedPlans) else plans
        with split_mode(model, "serial" if serial else resolve, fallbacks=self.fallbacks):
            out = forward(model, inputs, cache, return_hidden)
        if not audited:
            return out
        return self._audited(model, inputs, cache, out, plans, return_hidden)

    def _audited(
        self,
        model: nn.Module,
        inputs: mx.array,
        cache: list[Any],
        out: mx.array | tuple[mx.array, mx.array],
        plans: Plans,
        return_hidden: bool,
    ) -> mx.array | tuple[mx.array, mx.array]:
        """The verification's output ``out`` checked against serial steps from the same cache: the serial steps'
        output (the caches as they leave them); on a mismatch, the fallback, the warning and the diverging op."""
        width = inputs.shape[1]
        mx.eval(out)
        rewind(cache, width)
        reference = serial_forward(model, inputs, cache, return_hidden)
        self.audit.audited += 1
        got = out[0] if isinstance(out, tuple) else out
        want = reference[0] if isinstance(reference, tuple) else reference
        if np.array_equal(np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32))):
            return reference
        self.audit.mismatches += 1
        rewind(cache, width)
        level = plans(width).name if callable(plans) else ExactPlan.parse(plans).name
        self.audit.divergence = first_divergence(model, inputs, cache, plans, level)
        self.audit.fell_back_at = self.audit.verifications
        warnings.warn(
            f"exact verification differed from serial steps ({self.audit.divergence}); this generation verifies "
            "by serial steps from here on (its output stays exact; calibrate this context or report the device)",
            ExactAuditWarning,
            stacklevel=2,
        )
        return reference

    def audit_result(self) -> AuditResult | None:
        """This generation's audit (None when nothing was audited, calibrated further or run serially)."""
        audit = self.audit
        return audit if audit.rate > 0 or audit.beyond_reach or audit.calibrated else None

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


class FastVerifier(Verifier):
    """Fast verification that takes the row-invariant kernels where they are cheaper than MLX's own products: at
    each width, the calibrated exact level where calibration timed it at most ``FASTER_BY`` of the batched forward
    (``WidthCalibration.fast_level``: exact rows, for less), else MLX's batched forward, as past the cache lengths
    that width was calibrated at; plain steps as exact mode runs them (bit-identical one-row kernels where faster).
    ``verifier_for`` gives it where calibration tries the kernels (``uses_kernel``: CUDA; quantized on Metal)."""

    def __init__(
        self,
        model: nn.Module,
        widths: Sequence[int] = (),
        progress: Callable[[str], None] | None = None,
        context: int | None = None,
    ):
        self.model = model
        self.fallbacks: Counter[str] = Counter()
        self._calibrating = ExactVerifier(model, widths=widths, progress=progress, context=context)
        self._levels: dict[int, tuple[ExactPlan, int]] | None = None  # the generation's, while one runs

    def prepare(
        self, widths: Sequence[int], progress: Callable[[str], None] | None = None, context: int | None = None
    ) -> list[int]:
        """Calibrate the ``widths`` not calibrated yet, as exact mode does (``ExactVerifier.prepare``)."""
        return self._calibrating.prepare(widths, progress, context)

    def levels(self) -> dict[int, tuple[ExactPlan, int]]:
        """Per width whose fast level is not the batched forward: that level and the cache length it holds to."""
        calibration = load_calibration(self.model)
        found = calibration.widths.items() if calibration is not None else []
        return {w: (ExactPlan.parse(level), c.reach) for w, c in found if (level := c.fast_level) != "none"}

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self._levels = self.levels()
        try:
            yield
        finally:
            self._levels = None

    def decoding(self) -> contextlib.AbstractContextManager[list[str]]:
        return one_row_kernels(self.model)

    def forward(
        self, model: nn.Module, inputs: mx.array, cache: list[Any], return_hidden: bool = False
    ) -> mx.array | tuple[mx.array, mx.array]:
        levels = self._levels if self._levels is not None else self.levels()
        found = levels.get(inputs.shape[1]) if model is self.model else None
        if found is not None and cache_length(cache) <= found[1]:
            with split_mode(model, found[0], fallbacks=self.fallbacks):
                return forward(model, inputs, cache, return_hidden)
        return forward(model, inputs, cache, return_hidden)


class ExactAuditWarning(UserWarning):
    """An audited exact verification differed from serial steps (once per generation)."""


#: The level of a batch's exact forwards (``batch_verifier``): linear layers over all B·w rows through the row-invariant
#: kernels where the device's probe proved them, attention row (b, i) over request b's own keys in one
#: ``attention_rows`` call where proved, each else row by row (a counted fallback); experts one token per call.
BATCH_LEVEL = "attention/kernel+linear/kernel+experts"


def batch_verifier(model: nn.Module, verify: str) -> Verifier:
    """The verifier of a batch (``specbench.core.batch``) in verify mode ``verify``: fast, or exact at
    ``BATCH_LEVEL`` (each request's rows as its own serial steps compute them, whatever else is in the batch)."""
    if check_verify_mode(verify) == "fast":
        return FAST
    if layout_sensitive_attention():
        raise ValueError(
            f"exact batched verification needs attention that reads only the keys it attends, but cuDNN's is on: "
            f"unset {CUDNN_ATTENTION_ENV} (specbench sets it to 0) or verify the batch in fast mode"
        )
    return ExactVerifier(model, BATCH_LEVEL)


def verifier_for(
    model: nn.Module,
    verify: str,
    widths: Sequence[int] = (),
    progress: Callable[[str], None] | None = None,
    audit: float = 0.0,
    seed: int | None = None,
    context: int | None = None,
) -> Verifier:
    """The verifier of verify mode ``verify`` ("fast" or "exact") for ``model``; in exact mode with
    ``widths`` calibrated up front for caches of up to ``context`` tokens (see ``ExactVerifier.prepare``) and
    ``audit`` of its verifications compared with serial steps."""
    if check_verify_mode(verify) == "exact":
        return ExactVerifier(model, widths=widths, progress=progress, audit=audit, seed=seed, context=context)
    if check_audit_rate(audit) > 0:
        raise ValueError(
            "audit compares exact verifications with serial steps: it needs verify='exact' (a fast verification "
            "differs from serial steps by design); set verify='exact' or audit=0"
        )
    return FastVerifier(model, widths, progress, context) if uses_kernel(model) else FAST
