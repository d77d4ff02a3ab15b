"""Text a tokenizer can encode: prompts are checked where they enter, so that a lone surrogate (bytes that were
not UTF-8, as a command line or a JSON escape passes them on) is one clear error, not a tokenizer's traceback."""

from __future__ import annotations

from typing import Any


def check_text(text: str, name: str = "the prompt") -> str:
    """``text`` when a tokenizer can encode it; one ValueError naming ``name`` where it holds what is not text
    (a lone surrogate: bytes that were not UTF-8, as a command line or a file passes them on)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{name} cannot be tokenized: character {err.start} ({text[err.start]!r}) is not text "
            "(input that was not UTF-8?); give UTF-8 text"
        ) from None
    return text


def check_strings(value: Any, name: str) -> Any:
    """``value`` when every string in it (a message, a tool description: dicts and lists of them, keys
    included) is text a tokenizer can encode (``check_text``); one ValueError naming ``name`` otherwise."""
    if isinstance(value, str):
        check_text(value, name)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_strings(key, name)
            check_strings(item, name)
    elif isinstance(value, (list, tuple)):
        for item in value:
            check_strings(item, name)
    return value
