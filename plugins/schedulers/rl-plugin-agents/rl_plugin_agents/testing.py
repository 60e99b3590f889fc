"""Helpers for tests of ``agent_proxy`` (this package's and a user's own): a prompt row like the
calculator task's, and the scripted tool-call reply in the hermes format the tiny model's template shows."""

from __future__ import annotations

from typing import Any

from rlcore.chat_template import encode_prompt
from rlcore.types import Prompt

#: a reply calling the calculator, as a model of the hermes family writes it
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*13"}}\n</tool_call>'


def prompt(tokenizer: Any, question: str = "What is 12 * 13?", **data: Any) -> Prompt:
    """One prompt (a user question) with the row's columns: ``answer`` plus ``data``."""
    messages = [{"role": "user", "content": question}]
    return Prompt(messages=messages, prompt_ids=encode_prompt(tokenizer, messages), data={"answer": "156", **data})
