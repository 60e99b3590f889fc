"""Fixtures for rl-plugin-tips' tests: this plugin plus rl-plugin-math (the accuracy it prefers)."""

from __future__ import annotations

from typing import Any

import pytest

from rlcore.rollout import encode_prompt
from rlcore.types import Prompt


@pytest.fixture
def rlcore_plugins() -> str:
    """Load this package's plugin and rl-plugin-math, whose rewards the tests score with."""
    return "rl-plugin-tips,rl-plugin-math"


@pytest.fixture(scope="session")
def tokenizer(tiny_tokenizer: Any) -> Any:
    """The tiny model's tokenizer (rlcore's pytest plugin), under the name these tests use."""
    return tiny_tokenizer


@pytest.fixture
def make_prompt(tokenizer: Any):
    """A GSM8K-like prompt whose row holds the reference answer."""

    def make(question: str = "what is 3 + 4", answer: str = "3 + 4 = 7\n#### 7") -> Prompt:
        messages = [{"role": "user", "content": question}]
        return Prompt(messages=messages, prompt_ids=encode_prompt(tokenizer, messages), data={"question": question, "answer": answer})

    return make
