"""Is a completion's final answer right? The checks the rewards and the tip schedulers share.

``is_correct`` is the one entry point other packages use (rl-plugin-tips imports it when it is
installed): numeric references are compared by value (``gsm8k``), anything else goes through
math-verify, so one function serves GSM8K rows and LaTeX solutions alike.
"""

from __future__ import annotations

import threading
from typing import Any

from .extract import extract_number, same_number


def reference_text(value: Any) -> str | None:
    """A reference answer as text. Numbers are fine; a list/dict/other object is a dataset bug."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError(f"the reference answer must be text or a number, got {type(value).__name__}")
    return str(value)


def pick_reference(answer: Any = None, solution: Any = None) -> str | None:
    """The row's reference: its ``answer`` column, else its ``solution`` column."""
    ref = reference_text(answer)
    return ref if ref is not None and ref.strip() else reference_text(solution)


def gsm8k_correct(completion: str, reference: Any) -> bool | None:
    """Numeric comparison of final answers. None when the reference holds no number."""
    ref = extract_number(reference_text(reference))
    if ref is None:
        return None
    return same_number(extract_number(completion), ref)


def _timeout() -> int | None:
    # math-verify times out with signal.alarm, which only works in the main thread; rewards run in
    # worker threads (rlcore keeps blocking rewards off the event loop), where we must pass None.
    return 5 if threading.current_thread() is threading.main_thread() else None


def math_verify_correct(completion: str, reference: Any) -> bool | None:
    """math-verify's LaTeX-aware equivalence. None when the reference cannot be parsed."""
    from math_verify import parse, verify  # sympy is slow to import: only when first used

    ref = reference_text(reference)
    if ref is None:
        return None
    if "####" in ref:  # a GSM8K-style solution: the gold answer is what follows the marker
        ref = ref.rsplit("####", 1)[1].strip()
    timeout = _timeout()
    gold = parse(ref, parsing_timeout=timeout)
    if not gold:
        gold = parse(f"${ref}$", parsing_timeout=timeout)
    if not gold:
        return None
    pred = parse(completion, parsing_timeout=timeout)
    if not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout))


def is_correct(completion: str, reference: Any) -> bool | None:
    """The shared accuracy check: by value when the reference is a number (GSM8K), else by
    math-verify. None when the reference is missing or unreadable."""
    verdict = gsm8k_correct(completion, reference)
    if verdict is not None:
        # no math-verify second opinion here: it matches any expression in the text, so a wrong
        # final answer with the right number somewhere in the reasoning would count as correct
        return verdict
    return math_verify_correct(completion, reference)
