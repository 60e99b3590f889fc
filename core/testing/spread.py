"""Rows whose groups have reward spread or not, whatever the model says: for tests of what a run
does with groups that carry no learning signal (dynamic sampling, difficulty-aware prompt sampling)."""

from __future__ import annotations

from typing import Any


def easy_and_hard_rows(easy: int, hard: int) -> list[dict[str, Any]]:
    """``easy`` rows (``id`` e0, e1 …) then ``hard`` rows (h0, h1 …); the ``easy`` column tells :func:`by_row`."""
    return [{"prompt": f"easy {i}", "id": f"e{i}", "easy": True} for i in range(easy)] + \
        [{"prompt": f"hard {i}", "id": f"h{i}", "easy": False} for i in range(hard)]


def by_row(completions: list[str], easy: list[bool]) -> list[float]:
    """A reward: easy rows, every completion solves it (1.0, no spread); hard rows, every other
    completion does (spread)."""
    return [1.0 if e else float(i % 2) for i, e in enumerate(easy)]
