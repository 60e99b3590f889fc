"""Finding the score in a judge's reply.

Judges do not answer in one format: "Score: 7", "**Score:** 7/10", "I'd give it 8 out of 10",
"**8**", or just "7", often after a paragraph of reasoning that itself mentions numbers ("the
answer 42 is right", "on a scale of 0 to 10"). So the reply is read from the end: reasoning in
``<think>…</think>`` is dropped, then the *last* match of the first pattern that matches at all
wins, patterns tried from the most explicit to the least:

1. ``score`` / ``rating`` / ``grade`` followed by a number ("Score: 7", "Rating = 8.5", "**Score:** 9");
2. a fraction of the maximum ("7/10", "7 out of 10");
3. a number in bold ("**8**");
4. a reply that is a number and nothing else ("7", "7.").

Only the last 8,000 characters (after the reasoning is dropped) are read, and every pattern is
linear in their length: a judge that answers megabytes costs no more than one that answers a line.

A user-given pattern replaces all four: its first group (or the whole match) is the number, its
last match wins. A number outside ``[min_score, max_score]`` is no score (a judge that answered
"42" to a 0–10 rubric did not follow it): the reply is unparseable.
"""

from __future__ import annotations

import re

# a number that starts where no digit is before it: a run of digits is tried once, not once per digit
# (what keeps every pattern linear in the reply's length)
_NUMBER = r"(?<![\d.])[-+]?\d+(?:\.\d+)?"
_THINK = re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE)
#: only the end of a reply is read: the verdict comes last, and a reply of megabytes stays cheap
TAIL_CHARS = 8000

DEFAULT_PATTERNS = (
    re.compile(rf"\b(?:score|rating|grade)\b(?:[\s*_:=#]|-(?!\d))*(?:(?:is|of)\b[\s*_:=]*)?({_NUMBER})", re.IGNORECASE),
    re.compile(rf"({_NUMBER})\s*(?:/|out\s+of)\s*\d", re.IGNORECASE),
    re.compile(rf"\*\*\s*({_NUMBER})\s*\*\*"),
    re.compile(rf"\A\W*({_NUMBER})\W*\Z"),
)


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A user's score pattern, compiled case-insensitively (raises ``re.error`` when it is not a regex)."""
    return re.compile(pattern, re.IGNORECASE | re.MULTILINE)


def find_number(reply: str, patterns: tuple[re.Pattern[str], ...] = DEFAULT_PATTERNS) -> float | None:
    """The number the first matching pattern finds last in ``reply`` (reasoning dropped), or None."""
    text = _THINK.sub(" ", reply or "").strip()[-TAIL_CHARS:]
    for pattern in patterns:
        matches = list(pattern.finditer(text))
        if not matches:
            continue
        last = matches[-1]
        raw = last.group(1) if pattern.groups else last.group(0)
        try:
            return float(raw)
        except (TypeError, ValueError):
            return None  # a user pattern whose group is not a number
    return None


def parse_score(reply: str, max_score: float = 10.0, min_score: float = 0.0,
                patterns: tuple[re.Pattern[str], ...] = DEFAULT_PATTERNS) -> float | None:
    """The judge's score scaled to ``[0, 1]`` (``(s - min_score) / (max_score - min_score)``), or
    None when the reply holds no score in range."""
    value = find_number(reply, patterns)
    if value is None or not (min_score <= value <= max_score):
        return None
    return (value - min_score) / (max_score - min_score)
