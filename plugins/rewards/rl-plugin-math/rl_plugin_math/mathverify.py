"""``math_accuracy``: LaTeX-aware correctness with Hugging Face's math-verify."""

from __future__ import annotations

from typing import Any

from rlcore.errors import ConfigError
from rlcore.rewards import Reward

from .accuracy import math_verify_correct, pick_reference, timeouts


def math_accuracy(
    completions: list[str], solution: list[Any] | None = None, answer: list[Any] | None = None,
    timeout: float | None = None,
) -> list[float | None]:
    """1.0 when math-verify finds the completion's answer equivalent to the row's ``solution``
    (else ``answer``), 0.0 when not, None when the reference cannot be parsed. Handles
    ``\\boxed{}``, fractions, sets, intervals, units; a GSM8K ``#### N`` reference uses ``N``.

    Each check runs in a worker process killed after ``timeout`` seconds (default 5, or
    ``RLCORE_SAMPLE_TIMEOUT``); a sample that times out scores 0.0."""
    n = len(completions)
    solutions = solution if solution is not None else [None] * n
    answers = answer if answer is not None else [None] * n
    out: list[float | None] = []
    for text, s, a in zip(completions, solutions, answers):
        verdict = math_verify_correct(text, pick_reference(s, a), timeout)
        out.append(None if verdict is None else float(verdict))
    return out


class MathAccuracy(Reward):
    """``math_accuracy`` as a reward with options: ``timeout`` (seconds per sample, default 5 or
    ``RLCORE_SAMPLE_TIMEOUT``). Samples that time out score 0.0 and are counted in ``timeouts``
    (the trainer logs them as ``reward_timeouts/math_accuracy``)."""

    name = "math_accuracy"

    def __init__(self, timeout: float | None = None) -> None:
        if timeout is not None and not timeout > 0:
            raise ConfigError(f"math_accuracy: timeout must be a positive number of seconds, got {timeout}")
        self.timeout = timeout
        self.timeouts = 0

    def score(self, completions: list[str], solution: list[Any] | None = None, answer: list[Any] | None = None) -> list[float | None]:
        before = timeouts.count
        try:
            return math_accuracy(completions, solution, answer, timeout=self.timeout)
        finally:
            self.timeouts += timeouts.count - before
