"""Prompts: chat-template rendering and the project's bundled prompt sets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PROMPTS_DIR = Path(__file__).parent / "assets" / "prompts"


def render_prompt(tokenizer: Any, text_or_messages: str | list[dict], chat: bool = True) -> list[int]:
    """Token ids of a prompt: a user message (or a message list) through the chat template, or raw text."""
    messages = (
        [{"role": "user", "content": text_or_messages}] if isinstance(text_or_messages, str) else text_or_messages
    )
    if chat and getattr(tokenizer, "chat_template", None):
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    if not isinstance(text_or_messages, str):
        text_or_messages = "\n\n".join(m["content"] for m in messages)
    return list(tokenizer.encode(text_or_messages))
