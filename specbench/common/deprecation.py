"""Old public names kept for one release: they still work and warn (``FutureWarning``) with the new name.

One helper per kind of change: ``moved_names`` makes a module's ``__getattr__`` answer an old name (a class
or function renamed) with the new object, ``renamed_arguments`` lets a function take an old keyword argument
under its new name, ``renamed_attribute`` answers an old attribute name, and ``keyword_only_after`` lets a
function take arguments by position that became keyword-only.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

#: The release that drops the old names.
REMOVED_IN = "0.2"

F = TypeVar("F", bound=Callable[..., Any])


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that ``old`` is deprecated in favour of ``new`` (a ``FutureWarning``: users see it by default)."""
    warnings.warn(
        f"{old} is deprecated and will be removed in specbench {REMOVED_IN}: use {new}",
        FutureWarning,
        stacklevel=stacklevel,
    )


def moved_names(module: str, renamed: dict[str, tuple[str, Callable[[], Any]]]) -> Callable[[str], Any]:
    """A module ``__getattr__``: ``renamed[old] = (new name, lambda: new object)`` answers ``module.old`` (and
    ``from module import old``) with the new object, warning once per use; other names raise AttributeError."""

    def __getattr__(name: str) -> Any:
        if name in renamed:
            new, resolve = renamed[name]
            warn_renamed(f"{module}.{name}", new)
            return resolve()
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def renamed_arguments(**old_to_new: str) -> Callable[[F], F]:
    """Decorate a function so that each keyword ``old`` of ``old_to_new`` is passed on as its new keyword, with a
    warning; giving both the old and the new keyword is a TypeError."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in old_to_new.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{function.__qualname__}() got both {old}= and {new}=: give only {new}=")
                    warn_renamed(f"{function.__qualname__}({old}=...)", f"{new}=")
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def renamed_attribute(old: str, new: str) -> property:
    """A read-only property ``old`` answering attribute ``new``, with a warning (set it on the class as ``old``)."""

    def get(self: Any) -> Any:
        warn_renamed(f"{type(self).__name__}.{old}", f"{type(self).__name__}.{new}")
        return getattr(self, new)

    return property(get)


def keyword_only_after(count: int, *names: str) -> Callable[[F], F]:
    """Decorate a function whose parameters ``names`` became keyword-only after its first ``count`` positional
    ones: a call still passing them by position has them passed by keyword, with a warning."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if len(args) > count:
                extra = args[count:]
                if len(extra) > len(names):
                    raise TypeError(
                        f"{function.__qualname__}() takes at most {count + len(names)} positional arguments"
                    )
                given = names[: len(extra)]
                for name, value in zip(given, extra):
                    if name in kwargs:
                        raise TypeError(f"{function.__qualname__}() got multiple values for argument {name!r}")
                    kwargs[name] = value
                warn_renamed(
                    f"passing {', '.join(given)} to {function.__qualname__}() by position",
                    ", ".join(f"{name}=" for name in given),
                )
                args = args[:count]
            return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


__all__ = [
    "REMOVED_IN",
    "keyword_only_after",
    "moved_names",
    "renamed_arguments",
    "renamed_attribute",
    "warn_renamed",
]
