"""What this installation can do: drafters, verify modes, cost tools, traces, benchmarks.

Notebooks and reports ask here before a section runs, so a feature that is not installed (or
not set up, such as the embedded model's weights) becomes a clearly skipped section rather than
an error. ``capabilities()`` checks everything; ``require(name)`` raises ``MissingCapability``
with the reason; ``usable_drafters`` builds the drafters a model supports and says why the
others are left out.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence
from specbench.common.files import PROJECT_ROOT


class MissingCapability(RuntimeError):
    """A feature this installation lacks; the message says what is missing and how to get it."""


@dataclass(frozen=True)
class Capability:
    name: str
    available: bool
    detail: str


def _attributes(module: str, *names: str) -> Callable[[], str]:
    """A check: ``module`` imports and has every attribute in ``names``."""

    def check() -> str:
        try:
            mod = importlib.import_module(module)
        except ImportError as err:
            raise MissingCapability(f"{module} is not installed ({err})") from None
        missing = [n for n in names if not hasattr(mod, n)]
        if missing:
            raise MissingCapability(f"{module} lacks {', '.join(missing)}")
        return module

    return check


def _embedded_model() -> str:
    from specbench.models.embedded import smollm2_gguf_path

    try:
        return str(smollm2_gguf_path())
    except FileNotFoundError as err:
        raise MissingCapability(str(err)) from None


def _traces() -> str:
    _attributes("specbench.experiments.traces", "load_traces", "bundled_traces", "render_turn")()
    from specbench.experiments.traces import bundled_traces

    found = bundled_traces()
    if not found:
        raise MissingCapability("data/traces/ holds no trace files")
    return f"{len(found)} bundled trace files"


def _bundled_prompts() -> str:
    _attributes("specbench.experiments.prompts", "questions_from", "bundled_questions")()
    from specbench.experiments.prompts import BUNDLED_CATEGORIES, PROMPTS_DIR

    missing = [c for c in BUNDLED_CATEGORIES if not (PROMPTS_DIR / f"{c}.jsonl").is_file()]
    if missing:
        raise MissingCapability(f"bundled prompt files missing in {PROMPTS_DIR}: {', '.join(missing)}")
    return str(PROMPTS_DIR)


#: name -> check returning a detail string or raising MissingCapability.
CHECKS: dict[str, Callable[[], str]] = {
    "embedded_model": _embedded_model,
    "exact_verify": _attributes("specbench.exact.hooks", "exact_mode"),
    "drafter:lookup": _attributes("specbench.drafters.lookup", "PromptLookup"),
    "drafter:suffix": _attributes("specbench.drafters.suffix", "SuffixDecoding"),
    "drafter:mtp": _attributes("specbench.drafters.mtp", "MtpDrafter", "mtp_drafter_for"),
    "drafter:oracle": _attributes("specbench.drafters.oracle", "OracleDrafter"),
    "cost_profiles": _attributes("specbench.cost.profile", "measure", "break_even_acceptance", "speedup"),
    "cost_figures": _attributes("specbench.report.plots", "verify_costs", "break_even"),
    "speedup_grid": _attributes("specbench.cost.profile", "speedup_grid"),
    "synthetic_models": _attributes("specbench.models.synthetic", "build"),
    "simulator": _attributes("specbench.experiments.simulate", "simulate"),
    "traces": _traces,
    "trace_bench": _attributes("specbench.experiments.bench", "run_trace"),
    "bundled_prompts": _bundled_prompts,
}


def check(name: str) -> Capability:
    """One capability, checked now."""
    if name not in CHECKS:
        raise ValueError(f"unknown capability {name!r}: known are {', '.join(CHECKS)}")
    try:
        return Capability(name, True, CHECKS[name]())
    except MissingCapability as err:
        return Capability(name, False, str(err))


def capabilities() -> dict[str, Capability]:
    """Every capability of this installation, checked now."""
    return {name: check(name) for name in CHECKS}


def has(name: str) -> bool:
    return check(name).available


def require(*names: str) -> None:
    """Raise ``MissingCapability`` naming the first of ``names`` that is not available."""
    for name in names:
        cap = check(name)
        if not cap.available:
            raise MissingCapability(f"{name} is not available: {cap.detail}")


def usable_drafters(
    names: Sequence[str], model: Any = None, model_name: str | None = None
) -> tuple[dict[str, Callable[[], Any]], dict[str, str]]:
    """Factories for the drafters in ``names`` that work with ``model``, and why the others do not.

    Returns ``(factories, skipped)``: ``factories[name]()`` builds a fresh drafter (``None`` for
    "none", plain decoding); ``skipped[name]`` is the reason a drafter is left out (its module is
    not installed, or the model has nothing for it, such as an MTP head).
    """
    from specbench.drafters import make_drafter

    factories: dict[str, Callable[[], Any]] = {}
    skipped: dict[str, str] = {}
    for name in names:
        key = name.strip().lower()
        if key in ("none", "plain"):
            factories[key] = lambda: None
            continue
        cap = CHECKS.get(f"drafter:{key}")
        if cap is not None:
            state = check(f"drafter:{key}")
            if not state.available:
                skipped[key] = state.detail
                continue
        try:
            make_drafter(key, model=model, model_name=model_name)
        except (ImportError, FileNotFoundError) as err:
            skipped[key] = str(err)
            continue
        except ValueError as err:
            if key not in ("lookup", "suffix", "mtp", "none"):
                raise
            skipped[key] = str(err)
            continue
        factories[key] = lambda key=key: make_drafter(key, model=model, model_name=model_name)
    return factories, skipped


def summary_table() -> str:
    """The capabilities as aligned text lines (for printing)."""
    rows = capabilities().values()
    width = max(len(c.name) for c in rows)
    return "\n".join(f"{c.name:{width}s}  {'yes' if c.available else 'no '}  {c.detail}" for c in rows)


def project_root() -> Path:
    """The source tree holding the package (where notebooks/ and data/ live in a checkout)."""
    return PROJECT_ROOT
