"""``repetition``: an n-gram repetition penalty (Yeo et al.), against degenerate loops."""

from __future__ import annotations

from rlcore.errors import ConfigError
from rlcore.rewards import Reward


class Repetition(Reward):
    """``r = max_penalty * (1 - unique_ngrams / total_ngrams)`` over whitespace-separated words.

    0 for text with no repeated n-gram (or fewer than ``n`` words); approaches ``max_penalty``
    (negative) as the text becomes one phrase repeated.
    """

    name = "repetition"

    def __init__(self, n: int = 3, max_penalty: float = -1.0) -> None:
        if n < 1:
            raise ConfigError(f"repetition: n must be at least 1, got {n}")
        if max_penalty > 0:
            raise ConfigError(f"repetition: max_penalty must be zero or negative, got {max_penalty}")
        self.n = n
        self.max_penalty = max_penalty

    def value(self, text: str) -> float:
        words = text.lower().split()
        if len(words) < self.n:
            return 0.0
        ngrams = [tuple(words[i : i + self.n]) for i in range(len(words) - self.n + 1)]
        return self.max_penalty * (1.0 - len(set(ngrams)) / len(ngrams))

    def score(self, completions: list[str]) -> list[float]:
        return [self.value(text) for text in completions]
