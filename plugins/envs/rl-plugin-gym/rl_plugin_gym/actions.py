"""Parse the model's text into an action of a gymnasium action space.

Rules (documented in docs/plugins/gym.md): if the reply contains ``<answer>…</answer>`` only the
last such block is read. ``Discrete``: the last action *name* mentioned wins (case-insensitive,
whole words, aliases allowed); with no name, the last integer in range. ``Box``: the last
``prod(shape)`` numbers, clipped to the bounds. Anything else raises :class:`ActionParseError`
with a message written for the model.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Sequence

from .policy import ActionParseError

_INT = re.compile(r"(?<![\w.])[-+]?\d+(?!\w|\.\d)")  # "5." at a sentence end counts, "5.5" does not
_FLOAT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")

ActionParser = Callable[[str], Any]


def answer_text(text: str) -> str:
    """The part of a reply that holds the answer: the last ``<answer>`` block, else all of it."""
    # a scan from the end, not a lazy findall (quadratic in the number of unclosed <answer> tags)
    low = text.lower()
    end = low.rfind("</answer>")
    start = low.rfind("<answer>", 0, end) if end >= 0 else -1
    return text[start + len("<answer>") : end] if start >= 0 else text


def last_int(text: str) -> int | None:
    """The last integer in ``text`` (inside ``<answer>`` when there is one), or ``None``."""
    found = _INT.findall(answer_text(text))
    return int(found[-1]) if found else None


class DiscreteParser:
    """Reads a ``Discrete(n, start)`` action by name or by index."""

    def __init__(
        self,
        n: int,
        start: int = 0,
        names: Sequence[str] | None = None,
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        self.n, self.start = int(n), int(start)
        self.names = [str(x).upper() for x in names] if names else None
        if self.names is not None and len(self.names) != self.n:
            raise ValueError(f"{len(self.names)} action names for a Discrete({self.n}) space")
        self._lookup: dict[str, int] = {}
        if self.names:
            for i, name in enumerate(self.names):
                self._lookup[_key(name)] = i
            for alias, target in (aliases or {}).items():
                self._lookup[_key(alias)] = self.names.index(target.upper())
            words = sorted(self._lookup, key=len, reverse=True)
            self._names_re = re.compile(
                r"(?<![A-Za-z])(" + "|".join(_word_pattern(w) for w in words) + r")(?![A-Za-z])", re.I
            )

    def choices(self) -> str:
        """How a valid reply looks, for system messages and retry hints."""
        idx = f"{self.start}-{self.start + self.n - 1}"
        if self.names:
            return f"one of {', '.join(self.names)} (or its number {idx})"
        return f"a number from {idx}"

    def name_of(self, action: int) -> str:
        return self.names[action - self.start] if self.names else str(action)

    def __call__(self, text: str) -> int:
        body = answer_text(text)
        if self.names:
            found = self._names_re.findall(body)
            if found:
                return self.start + self._lookup[_key(found[-1])]
        ints = _INT.findall(body)
        if not ints:
            raise ActionParseError(f"no action found; reply with {self.choices()}")
        value = int(ints[-1])
        if not self.start <= value < self.start + self.n:
            raise ActionParseError(f"{value} is out of range; reply with {self.choices()}")
        return value


class BoxParser:
    """Reads a ``Box`` action from the last ``prod(shape)`` numbers of the reply, clipped to bounds."""

    def __init__(self, space: Any) -> None:
        import numpy as np

        self.space = space
        self.size = int(np.prod(space.shape)) if space.shape else 1

    def choices(self) -> str:
        low, high = self.space.low.ravel().tolist(), self.space.high.ravel().tolist()
        bounds = ", ".join(f"[{lo:g}, {hi:g}]" for lo, hi in zip(low, high))
        return f"{self.size} number(s) within {bounds}"

    def name_of(self, action: Any) -> str:
        return " ".join(f"{x:g}" for x in action.ravel().tolist())

    def __call__(self, text: str) -> Any:
        import numpy as np

        found = _FLOAT.findall(answer_text(text))
        if len(found) < self.size:
            raise ActionParseError(f"found {len(found)} number(s); reply with {self.choices()}")
        values = np.array([float(x) for x in found[-self.size:]], dtype=self.space.dtype)
        values = values.reshape(self.space.shape)
        return np.clip(values, self.space.low, self.space.high)


def parser_for(space: Any, names: Sequence[str] | None = None, aliases: Mapping[str, str] | None = None) -> Any:
    """The parser for a gymnasium action space, or ``None`` when text cannot express its actions."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return DiscreteParser(int(space.n), int(space.start), names, aliases)
    if isinstance(space, spaces.Box):
        return BoxParser(space)
    return None


def _key(word: str) -> str:
    return re.sub(r"[\s_-]+", "", word).upper()


def _word_pattern(word: str) -> str:
    """``PICKUP`` also matches ``pick up``/``pick-up``/``pick_up``."""
    return r"[\s_-]*".join(re.escape(ch) for ch in word)
