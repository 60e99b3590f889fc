"""Pull the final numeric answer out of free text, the way GSM8K graders read it.

Why a hand-written extractor and not math-verify here: GSM8K answers are plain numbers written
by people and models in many surface forms (``$1,000.00``, ``18 dollars``, ``18.``, ``50%``,
``\\boxed{18}``), and a cheap, deterministic, thread-safe parse is what a reward that runs on
every completion of every step needs. LaTeX-heavy answers belong to ``math_accuracy``.
"""

from __future__ import annotations

import re
from fractions import Fraction

# a number: optional sign, thousands groups or plain digits, optional decimals, optional "/denominator"
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?|-?\.\d+")
_HASH = re.compile(r"####")
_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*(-?[\d.,]+)\s*\}\s*\{\s*(-?[\d.,]+)\s*\}")
_LATEX_NOISE = re.compile(r"\\[,;:! ]|\{,\}|\\\$|\\%|\\text\{[^{}]{0,200}\}|\\mathrm\{[^{}]{0,200}\}|\\left|\\right")


def find_numbers(text: str) -> list[str]:
    """Every number in ``text`` in order, as written (commas kept). A ``-`` glued to a preceding
    digit or letter is a minus operator (``16-3``), not a sign, so it is dropped."""
    out = []
    for m in _NUMBER.finditer(text):
        s = m.group(0)
        if s.startswith("-") and m.start() > 0 and (text[m.start() - 1].isalnum() or text[m.start() - 1] in ")]}"):
            s = s[1:]
        out.append(s)
    return out


def to_fraction(number: str) -> Fraction | None:
    """``"1,000.50"`` -> Fraction(2001, 2); ``"3/4"`` -> Fraction(3, 4); unparseable -> None."""
    s = number.replace(",", "").replace(" ", "")
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            d = Fraction(den)
            return None if d == 0 else Fraction(num) / d
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces matched; None if absent."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    i = starts[-1]
    depth = 1
    j = i
    while j < len(text) and depth:
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
        j += 1
    return text[i : j - 1] if depth == 0 else text[i:]


def last_answer_tag(text: str) -> str | None:
    """Content of the last complete ``<answer>…</answer>``; None if there is none. A scan from the
    end (not a lazy regex, which is quadratic in the number of unclosed ``<answer>`` tags)."""
    end = text.rfind("</answer>")
    if end < 0:
        return None
    start = text.rfind("<answer>", 0, end)
    if start < 0:
        return None
    return text[start + len("<answer>") : end]


def _clean_latex(s: str) -> str:
    s = _FRAC.sub(lambda m: f"{m.group(1)}/{m.group(2)}", s)
    return _LATEX_NOISE.sub("", s)


def final_answer_text(text: str) -> tuple[str, str] | None:
    """Where the final answer sits and how it was marked: ``("####", rest)``, ``("boxed", content)``,
    ``("answer", tag content)`` or ``("last", text)``, tried in that order."""
    hashes = list(_HASH.finditer(text))
    if hashes:
        rest = text[hashes[-1].end() :].strip()
        return "####", rest.splitlines()[0] if rest else ""
    boxed = last_boxed(text)
    if boxed is not None:
        return "boxed", _clean_latex(boxed)
    tag = last_answer_tag(text)
    if tag is not None:
        return "answer", _clean_latex(tag)
    return "last", _clean_latex(text)


def extract_number(text: str | int | float | None) -> Fraction | None:
    """The final numeric answer of ``text``: the number after the last ``####``, else the last
    number in the last ``\\boxed{}``, else in the last ``<answer>`` tag, else the last number in the
    text. Commas, ``$``, units, ``%`` and a trailing ``.0`` do not matter. None when there is none."""
    if text is None:
        return None
    if isinstance(text, bool):
        raise TypeError(f"expected text or a number, got {text!r}")
    if isinstance(text, (int, float)):
        return Fraction(str(text))
    if not isinstance(text, str):
        raise TypeError(f"expected text or a number, got {type(text).__name__}")
    found = final_answer_text(text)
    if found is None:
        return None
    where, part = found
    nums = find_numbers(part)
    if not nums:
        return None
    # after "####" the answer comes first ("#### 18 (9 * 2)"); elsewhere the conclusion comes last
    return to_fraction(nums[0] if where == "####" else nums[-1])


def same_number(a: Fraction | None, b: Fraction | None, rel_tol: float = 1e-6) -> bool:
    """Exact when both are integers (``1450001`` is not ``1450000``); when one is not, a tiny
    relative tolerance forgives rounded repeating decimals (``0.333333`` vs ``1/3``)."""
    if a is None or b is None:
        return False
    if a == b or (a.denominator == 1 and b.denominator == 1):
        return a == b
    # exact rational arithmetic: float() of a 400-digit answer would raise OverflowError
    return abs(a - b) <= Fraction(rel_tol) * max(Fraction(1), abs(b))
