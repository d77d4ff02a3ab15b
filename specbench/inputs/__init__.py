"""Inputs: prompts (chat-template rendering with ``render_prompt``, the bundled prompt sets), conversation traces
and their importers, trace turn prompts, stored results read back, and what this installation has."""
