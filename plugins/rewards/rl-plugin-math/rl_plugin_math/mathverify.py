"""``math_accuracy``: LaTeX-aware correctness with Hugging Face's math-verify."""

from __future__ import annotations

from typing import Any

from .accuracy import math_verify_correct, pick_reference


def math_accuracy(completions: list[str], solution: list[Any] | None = None, answer: list[Any] | None = None) -> list[float | None]:
    """1.0 when math-verify finds the completion's answer equivalent to the row's ``solution``
    (else ``answer``), 0.0 when not, None when the reference cannot be parsed. Handles
    ``\\boxed{}``, fractions, sets, intervals, units; a GSM8K ``#### N`` reference uses ``N``."""
    n = len(completions)
    solutions = solution if solution is not None else [None] * n
    answers = answer if answer is not None else [None] * n
    out: list[float | None] = []
    for text, s, a in zip(completions, solutions, answers):
        verdict = math_verify_correct(text, pick_reference(s, a))
        out.append(None if verdict is None else float(verdict))
    return out
