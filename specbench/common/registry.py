"""One registry per extension point (subcommands, drafters, acceptance rules): a name -> entry table that a
module fills by registering itself, and that every caller (command line choices and help, benches, reports) reads.

A registry with a ``package`` imports every module of that package before it is first read, so that a new
drafter or rule is one new module there: nothing else names it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries by name, in the order they were registered; ``what`` names an entry in errors ("drafter")."""

    def __init__(self, what: str, package: str | None = None):
        self.what = what
        self.package = package
        self._entries: dict[str, T] = {}
        self._loaded = package is None

    def add(self, name: str, entry: T) -> T:
        """Register ``entry`` as ``name`` (a name registered twice is an error); returns ``entry``."""
        if name in self._entries and self._entries[name] is not entry:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def remove(self, name: str) -> None:
        """Forget ``name`` (a registration made for a while, as a test's)."""
        self._entries.pop(name, None)

    def _load(self) -> None:
        """Import every module of the package (once), each registering what it defines."""
        if self._loaded:
            return
        self._loaded = True
        package = importlib.import_module(str(self.package))
        for module in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{self.package}.{module.name}")

    def names(self) -> tuple[str, ...]:
        self._load()
        return tuple(self._entries)

    def items(self) -> list[tuple[str, T]]:
        self._load()
        return list(self._entries.items())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        self._load()
        return name in self._entries

    def __getitem__(self, name: str) -> T:
        """The entry ``name``, else one ValueError naming the choices."""
        self._load()
        if name not in self._entries:
            raise ValueError(f"unknown {self.what} {name!r}: choose one of {', '.join(self._entries)}")
        return self._entries[name]
