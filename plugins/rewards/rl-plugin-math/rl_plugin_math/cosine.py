"""``cosine``: accuracy scaled by length along a cosine (Yeo et al., "Demystifying Long CoT").

Why: a plain 0/1 accuracy gives no signal about length, and long chains of thought grow without
bound. Here a right answer earns more the shorter it is, and a wrong answer is punished less the
longer it is (the model is encouraged to keep thinking when it has not got there yet).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from rlcore.errors import ConfigError
from rlcore.rewards import Reward

from .accuracy import is_correct, pick_reference, timeouts

AccuracyFn = Callable[[str, Any], "bool | None"]


class Cosine(Reward):
    """``r = short + (long - short) * (1 - cos(pi * min(L, max_len) / max_len)) / 2`` where ``L`` is
    the completion length in tokens and ``(short, long)`` are ``(correct_short, correct_long)`` for a
    right answer and ``(wrong_short, wrong_long)`` for a wrong one. None when the row has no reference.
    """

    name = "cosine"

    def __init__(
        self,
        max_len: int = 1024,
        correct_short: float = 1.0,
        correct_long: float = 0.5,
        wrong_short: float = -0.5,
        wrong_long: float = 0.0,
        accuracy: AccuracyFn | None = None,
        timeout: float | None = None,
    ) -> None:
        if max_len <= 0:
            raise ConfigError(f"cosine: max_len must be a positive number of tokens, got {max_len}")
        self.max_len = max_len
        self.correct = (correct_short, correct_long)
        self.wrong = (wrong_short, wrong_long)
        if timeout is not None and not timeout > 0:
            raise ConfigError(f"cosine: timeout must be a positive number of seconds, got {timeout}")
        self.accuracy: AccuracyFn = accuracy or is_correct
        self.timeout = timeout  # per math-verify check (the default accuracy); a timed-out sample is wrong
        self.timeouts = 0

    def value(self, correct: bool, length: int) -> float:
        """The reward of one completion of ``length`` tokens."""
        short, long = self.correct if correct else self.wrong
        progress = min(length, self.max_len) / self.max_len
        return short + (long - short) * (1.0 - math.cos(math.pi * progress)) / 2.0

    def score(
        self,
        completions: list[str],
        completion_ids: list[list[int]],
        answer: list[Any] | None = None,
        solution: list[Any] | None = None,
    ) -> list[float | None]:
        n = len(completions)
        answers = answer if answer is not None else [None] * n
        solutions = solution if solution is not None else [None] * n
        out: list[float | None] = []
        before = timeouts.count
        try:
            for text, ids, a, s in zip(completions, completion_ids, answers, solutions):
                ref = pick_reference(a, s)
                verdict = is_correct(text, ref, self.timeout) if self.accuracy is is_correct else self.accuracy(text, ref)
                out.append(None if verdict is None else self.value(bool(verdict), len(ids)))
        finally:
            self.timeouts += timeouts.count - before
        return out
