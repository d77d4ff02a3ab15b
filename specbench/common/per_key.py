"""Settings given once for every key, or per key as a mapping."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


def per_key(value: Any, keys: Iterable[K], convert: Callable[[Any], T], missing: str) -> dict[K, T]:
    """``convert(value[key])`` for each key when ``value`` is a mapping, else one ``convert(value)``
    for every key. Keys the mapping lacks raise ValueError(``missing.format(those keys)``)."""
    keys = list(keys)
    if isinstance(value, Mapping):
        if lacking := [key for key in keys if key not in value]:
            raise ValueError(missing.format(lacking))
        return {key: convert(value[key]) for key in keys}
    return dict.fromkeys(keys, convert(value))
