"""Prompt sets: no option leaves a user's prompts out without saying how many and why."""

from __future__ import annotations

import warnings

import pytest

from specbench.inputs.prompts import PromptsLeftOut, prompts_from


class _Tokenizer:
    """Characters as token ids; no chat template."""

    chat_template = None

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 97 for c in text]


@pytest.fixture
def tokenizer():
    return _Tokenizer()


def test_a_limit_on_a_users_prompts_says_how_many_it_leaves_out(tokenizer):
    with pytest.warns(PromptsLeftOut, match="2 of 3 prompts left out: limit=1 keeps the first 1"):
        kept = prompts_from(["aa", "bb", "cc"], tokenizer, limit=1, chat=False)
    assert [p.text for p in kept] == ["aa"]


def test_a_length_limit_says_how_many_prompts_it_leaves_out(tokenizer):
    with pytest.warns(PromptsLeftOut, match="1 of 3 prompts left out: longer than max_prompt_tokens=3"):
        kept = prompts_from(["aa", "bbbbbb", "cc"], tokenizer, chat=False, max_prompt_tokens=3)
    assert [p.text for p in kept] == ["aa", "cc"]


def test_nothing_is_said_where_nothing_is_left_out(tokenizer):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PromptsLeftOut)
        assert len(prompts_from(["aa", "bb"], tokenizer, limit=5, chat=False, max_prompt_tokens=10)) == 2
