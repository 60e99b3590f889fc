"""Is a completion's final answer right? The checks the rewards and the tip schedulers share.

``is_correct`` is the one entry point other packages use (rl-plugin-tips imports it when it is
installed): numeric references are compared by value (``gsm8k``), anything else goes through
math-verify, so one function serves GSM8K rows and LaTeX solutions alike.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from rlcore.bounded import DEFAULT_TIMEOUT, BoundedWorker, CallFailed, CallTimedOut
from rlcore.errors import MissingDependencyError

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


#: Seconds one math-verify check may take before its worker is killed and the sample scores 0.
#: ``RLCORE_SAMPLE_TIMEOUT`` overrides it for a run; ``MathAccuracy(timeout=…)`` / ``Cosine(timeout=…)``
#: per reward.
def default_timeout() -> float:
    try:
        return float(os.environ.get("RLCORE_SAMPLE_TIMEOUT", "") or DEFAULT_TIMEOUT)
    except ValueError:
        return DEFAULT_TIMEOUT


class _Timeouts(threading.local):
    """Math-verify checks that hit their deadline (or exhausted memory/recursion, or whose worker
    died), counted per thread: a reward scores a batch on one thread, so the difference before and
    after its batch is its own count even while other rewards score concurrently."""

    count = 0


timeouts = _Timeouts()


_worker: BoundedWorker | None = None
_worker_pid = 0
_worker_lock = threading.Lock()


def _math_worker() -> BoundedWorker:
    """This process's math-verify worker (a forked child starts its own: pipes are not shareable)."""
    global _worker, _worker_pid
    with _worker_lock:
        if _worker is None or _worker_pid != os.getpid():
            _worker_pid = os.getpid()
            _worker = BoundedWorker("rl_plugin_math.accuracy:math_verify_direct", timeout=DEFAULT_TIMEOUT,
                                    warmup=("\\boxed{\\frac{1}{2}}", "0.5"))
        return _worker


def math_verify_direct(completion: str, reference: Any) -> bool | None:
    """math-verify in this process with no time limit. Only for the bounded worker (and trusted
    text): on model output call :func:`math_verify_correct`, which kills a check at its deadline."""
    from math_verify import parse, verify  # sympy is slow to import: only when first used

    ref = reference_text(reference)
    if ref is None:
        return None
    if "####" in ref:  # a GSM8K-style solution: the gold answer is what follows the marker
        ref = ref.rsplit("####", 1)[1].strip()
    gold = parse(ref, parsing_timeout=None)
    if not gold:
        gold = parse(f"${ref}$", parsing_timeout=None)
    if not gold:
        return None
    pred = parse(completion, parsing_timeout=None)
    if not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=None))


def math_verify_correct(completion: str, reference: Any, timeout: float | None = None) -> bool | None:
    """math-verify's LaTeX-aware equivalence, run in a worker process killed after ``timeout``
    seconds (default :func:`default_timeout`). None when the reference cannot be parsed; False when
    the check timed out or ran out of memory (counted in ``timeouts.count``)."""
    reference_text(reference)  # a wrong reference type is a dataset bug: raise here, in the caller
    if not isinstance(completion, str):
        raise TypeError(f"expected the completion as text, got {type(completion).__name__}")
    try:
        return _math_worker().call(completion, reference, timeout=timeout if timeout is not None else default_timeout())
    except CallTimedOut:
        timeouts.count += 1
        return False
    except CallFailed as exc:
        if exc.kind in ("MemoryError", "RecursionError", "WorkerDied", "OverflowError"):
            timeouts.count += 1
            return False
        if exc.kind == "WorkerStartError" or exc.kind in ("ModuleNotFoundError", "ImportError"):
            raise MissingDependencyError(f"math-verify could not run: {exc}; pip install 'math-verify[antlr4_13_2]'") from None
        raise


def is_correct(completion: str, reference: Any, timeout: float | None = None) -> bool | None:
    """The shared accuracy check: by value when the reference is a number (GSM8K), else by
    math-verify. None when the reference is missing or unreadable."""
    verdict = gsm8k_correct(completion, reference)
    if verdict is not None:
        # no math-verify second opinion here: it matches any expression in the text, so a wrong
        # final answer with the right number somewhere in the reasoning would count as correct
        return verdict
    return math_verify_correct(completion, reference, timeout)
