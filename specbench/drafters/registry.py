"""The drafter registry: each drafter module registers its kind (name, factory, one line, what it needs), and every
caller (``make_drafter``, the command line's ``--drafter`` choices and help, the benches, the simulator) reads it.

A new drafter is one module in ``specbench/drafters/`` that calls ``register_drafter``; nothing else names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specbench.common.registry import Registry
from specbench.core.draft import Drafter

#: What a drafter may need besides the context: the target model's weights, an MTP head for it, a draft model.
NEEDS = ("model", "head", "draft model")
#: Names that choose no drafter (plain decoding).
NO_DRAFTER = ("none", "plain")


@dataclass(frozen=True)
class DrafterInputs:
    """What a factory is given: the target ``model`` (and the name it was loaded by), a ``draft_model``, the
    ``value`` after the name's colon (``suffix:8``: 8; None without one) and ``max_draft``, the longest draft
    the caller will ask for when it knows it (a drafter may size itself to it; None: unknown)."""

    model: Any = None
    model_name: str | None = None
    draft_model: Any = None
    value: int | None = None
    max_draft: int | None = None


@dataclass(frozen=True)
class DrafterKind:
    """A registered drafter: its ``name``, ``build(inputs)`` giving a fresh one, a one-line ``description``,
    what it ``needs`` (of ``NEEDS``; none: model-free, the simulator replays it) and, when it takes a positive
    integer after a colon (``suffix:K``), its ``parameter``, described ("K: drafts of up to K tokens")."""

    name: str
    build: Callable[[DrafterInputs], Drafter]
    description: str
    needs: tuple[str, ...] = ()
    parameter: str | None = None

    def __post_init__(self) -> None:
        if unknown := [n for n in self.needs if n not in NEEDS]:
            raise ValueError(f"drafter {self.name!r} needs {unknown}: name what it needs from {', '.join(NEEDS)}")

    @property
    def model_free(self) -> bool:
        return not self.needs

    @property
    def spelling(self) -> str:
        """The name as help text shows it: ``suffix[:K]`` for one that takes a parameter."""
        return f"{self.name}[:{self.parameter.split(':')[0]}]" if self.parameter else self.name


DRAFTERS: Registry[DrafterKind] = Registry("drafter", package="specbench.drafters")


def register_drafter(
    name: str, description: str, needs: tuple[str, ...] = (), parameter: str | None = None
) -> Callable[[Callable[[DrafterInputs], Drafter]], Callable[[DrafterInputs], Drafter]]:
    """Register the decorated ``build(inputs)`` as drafter ``name`` (see ``DrafterKind``)."""

    def wrap(build: Callable[[DrafterInputs], Drafter]) -> Callable[[DrafterInputs], Drafter]:
        DRAFTERS.add(name, DrafterKind(name, build, description, tuple(needs), parameter))
        return build

    return wrap


def drafter_kinds() -> list[DrafterKind]:
    """Every registered drafter, in registration order."""
    return [kind for _, kind in DRAFTERS.items()]


def drafter_choices() -> str:
    """The drafters as a command line's help lists them: ``lookup, suffix[:K], ..., none``."""
    return ", ".join([*(kind.spelling for kind in drafter_kinds()), "none"])


def split_drafter_name(name: str) -> tuple[DrafterKind | None, int | None]:
    """The kind and parameter ``name`` spells (None for ``none``/``plain``), else one clear ValueError."""
    key = name.strip().lower()
    base, colon, value = key.partition(":")
    if key in (*NO_DRAFTER, ""):
        return None, None
    if base not in DRAFTERS:
        raise ValueError(f"unknown drafter {name!r}: choose one of {drafter_choices()}")
    kind = DRAFTERS[base]
    if not colon:
        return kind, None
    if kind.parameter is None:
        raise ValueError(f"drafter {base!r} takes no parameter after a colon, got {name!r}")
    if not (value.isdigit() and int(value) >= 1):
        letter = kind.parameter.split(":")[0]
        raise ValueError(f"drafter {name!r}: write {base}:{letter} with {letter} a positive integer ({kind.parameter})")
    return kind, int(value)


def is_drafter_name(name: str) -> bool:
    """Whether ``name`` names a drafter or none (``suffix:K`` and the like included, K a positive integer)."""
    try:
        split_drafter_name(name)
    except ValueError:
        return False
    return True
