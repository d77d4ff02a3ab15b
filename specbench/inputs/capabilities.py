"""What this installation has: the embedded model, the bundled traces and prompts, the drafters a model supports.

Notebooks and reports ask here before a section runs, so what is missing (such as the embedded
model's weights) becomes a clearly skipped section rather than an error. ``check(name)`` says whether one is
available and why not; ``usable_drafters`` builds the drafters a model supports and says why the others are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specbench.drafters import make_drafter, split_drafter_name
from specbench.inputs.prompts import BUNDLED_CATEGORIES, PROMPTS_DIR
from specbench.inputs.traces import bundled_traces
from specbench.models.embedded import smollm2_gguf_path


class MissingCapability(RuntimeError):
    """Something this installation lacks; the message says what is missing and how to get it."""


@dataclass(frozen=True)
class Capability:
    name: str
    available: bool
    detail: str


def _embedded_model() -> str:
    try:
        return str(smollm2_gguf_path())
    except FileNotFoundError as err:
        raise MissingCapability(str(err)) from None


def _traces() -> str:
    found = bundled_traces()
    if not found:
        raise MissingCapability("no bundled trace files")
    return f"{len(found)} bundled trace files"


def _bundled_prompts() -> str:
    if missing := [c for c in BUNDLED_CATEGORIES if not (PROMPTS_DIR / f"{c}.jsonl").is_file()]:
        raise MissingCapability(f"bundled prompt files missing in {PROMPTS_DIR}: {', '.join(missing)}")
    return str(PROMPTS_DIR)


#: name -> check returning a detail string or raising MissingCapability.
CHECKS: dict[str, Callable[[], str]] = {
    "embedded_model": _embedded_model,
    "traces": _traces,
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
    """Whether capability ``name`` is available."""
    return check(name).available


def usable_drafters(
    names: Sequence[str], model: Any = None, model_name: str | None = None
) -> tuple[dict[str, Callable[[], Any]], dict[str, str]]:
    """Factories for the drafters in ``names`` that work with ``model``, and why the others do not.

    Returns ``(factories, skipped)``: ``factories[name]()`` builds a fresh drafter (``None`` for
    "none", plain decoding); ``skipped[name]`` is the reason a drafter is left out (the model has
    nothing for it, such as an MTP head). An unknown drafter name raises ValueError.
    """
    factories: dict[str, Callable[[], Any]] = {}
    skipped: dict[str, str] = {}
    for name in names:
        key = name.strip().lower()
        split_drafter_name(key)  # an unknown name raises
        try:
            make_drafter(key, model=model, model_name=model_name)
        except (FileNotFoundError, ValueError) as err:
            skipped[key] = str(err)
            continue
        factories[key] = lambda key=key: make_drafter(key, model=model, model_name=model_name)
    return factories, skipped


def summary_table() -> str:
    """The capabilities as aligned text lines (for printing)."""
    rows = capabilities().values()
    width = max(len(c.name) for c in rows)
    return "\n".join(f"{c.name:{width}s}  {'yes' if c.available else 'no '}  {c.detail}" for c in rows)
