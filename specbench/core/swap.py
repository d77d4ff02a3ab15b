"""Swapping a model module's class for one that mixes behaviour in front of it, and back.

Cache rollback records a hybrid model's recurrent layers, token trees give attention their mask and positions,
expert counting records routed experts: each gives some modules, for a while, a subclass of their own class with
a mixin in front (made once per pair and kept), and state the mixin reads in the module's ``__dict__``.
"""

from __future__ import annotations

from typing import Any

#: The mixed classes made so far, by (mixin, own class).
_MIXED: dict[tuple[type, type], type] = {}


def own_class(module: Any) -> type:
    """The class ``module`` had before ``swap_class`` (its class when not swapped)."""
    return type(module).__dict__.get("_specbench_own_class", type(module))


def mixed_class(mixin: type, base: type) -> type:
    """The subclass of ``base`` with ``mixin`` in front, made once; ``base`` may be a mixed class itself (a
    mixin put in front of another for a while), whose own class stays the module's own class."""
    cls = _MIXED.get((mixin, base))
    if cls is None:
        name = f"{mixin.__name__.lstrip('_')}{base.__name__}"
        own = base.__dict__.get("_specbench_own_class", base)
        cls = _MIXED[(mixin, base)] = type(name, (mixin, base), {"_specbench_own_class": own})
    return cls


def swap_class(module: Any, mixin: type, **state: Any) -> None:
    """Give ``module`` its own class with ``mixin`` in front and ``state`` in its ``__dict__`` (swapped again,
    it keeps its own class underneath)."""
    module.__dict__.update(state)
    module.__class__ = mixed_class(mixin, own_class(module))


def restore_class(module: Any, *state: str) -> None:
    """Undo ``swap_class``: ``module``'s own class back, the named ``state`` entries dropped."""
    module.__class__ = own_class(module)
    for name in state:
        module.__dict__.pop(name, None)
