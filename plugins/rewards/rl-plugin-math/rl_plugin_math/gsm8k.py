"""GSM8K rewards: final-answer accuracy and answer format (seed 001's pair)."""

from __future__ import annotations

import re
from typing import Any, Literal

from rlcore.errors import ConfigError
from rlcore.rewards import Reward

from .accuracy import gsm8k_correct, pick_reference

_N = r"\$?\s*-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_HASH_TAIL = re.compile(rf"\s*{_N}\s*\.?\s*")
_TAGS_FORMAT = re.compile(r"(?s)\s*<think>\s*\S.*?</think>\s*<answer>\s*\S.*?</answer>\s*")


def gsm8k_accuracy(completions: list[str], answer: list[Any] | None = None, solution: list[Any] | None = None) -> list[float | None]:
    """1.0 when the completion's final number equals the row's, else 0.0; None when the row has no
    numeric reference. The final number is the one after ``####``, else in ``\\boxed{}``, else in
    ``<answer>``, else the last number; commas, ``$``, units and a trailing ``.0`` are ignored."""
    n = len(completions)
    answers = answer if answer is not None else [None] * n
    solutions = solution if solution is not None else [None] * n
    out: list[float | None] = []
    for text, a, s in zip(completions, answers, solutions):
        verdict = gsm8k_correct(text, pick_reference(a, s))
        out.append(None if verdict is None else float(verdict))
    return out


class GSM8KFormat(Reward):
    """1.0 when the completion has the expected shape, else 0.0.

    ``mode="hash"`` (default, GSM8K's own): some reasoning, then a last line ``#### <number>``.
    ``mode="tags"``: ``<think>…</think><answer>…</answer>`` and nothing else (R1-style prompts).
    """

    name = "gsm8k_format"

    def __init__(self, mode: Literal["hash", "tags"] = "hash") -> None:
        if mode not in ("hash", "tags"):
            raise ConfigError(f"gsm8k_format: mode must be 'hash' or 'tags', got {mode!r}")
        self.mode = mode

    def matches(self, text: str) -> bool:
        """Linear-time checks (a lazy regex over the whole text is quadratic on hostile output)."""
        if self.mode == "tags":
            # one of each tag first: then the pattern has a single alignment and matches in linear time
            return all(text.count(tag) == 1 for tag in ("<think>", "</think>", "<answer>", "</answer>")) and \
                _TAGS_FORMAT.fullmatch(text) is not None
        # hash: some reasoning, a newline, then a last line "#### <number>" (only the last #### can
        # be followed by nothing but a number)
        idx = text.rfind("####")
        if idx < 0 or _HASH_TAIL.fullmatch(text, idx + 4) is None:
            return False
        head = text[:idx]
        body = head.rstrip()
        return bool(body) and "\n" in head[len(body):]

    def score(self, completions: list[str]) -> list[float]:
        return [1.0 if self.matches(text) else 0.0 for text in completions]
