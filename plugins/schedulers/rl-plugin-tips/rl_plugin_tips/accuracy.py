"""Deciding "is this answer right?" for the tip schedulers.

Preference order: a user-supplied function (a callable or a ``"module:attr"`` string from a config
file), else rl-plugin-math's ``is_correct`` when that package is installed (the same check as the
``gsm8k_accuracy``/``math_accuracy`` rewards, so tips and rewards agree), else a small built-in
fallback that compares final numbers or ``<answer>`` contents.
"""

from __future__ import annotations

import importlib
import re
from fractions import Fraction
from typing import Any, Callable

from rlcore.errors import ConfigError
from rlcore.types import Trajectory

AccuracyFn = Callable[[str, Any], "bool | None"]

#: dataset columns tried, in order, for the reference answer
REFERENCE_KEYS = ("solution", "answer")

_NUM = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _final(text: str) -> str:
    """The final answer as text: after the last ``####``, else in the last ``<answer>``, else all."""
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    tags = _ANSWER.findall(text)
    return tags[-1].strip() if tags else text


def _last_number(text: str) -> Fraction | None:
    nums = _NUM.findall(text)
    if not nums:
        return None
    try:
        return Fraction(nums[-1].replace(",", ""))
    except ValueError:
        return None


def fallback_is_correct(completion: str, reference: Any) -> bool | None:
    """Last number of the final answer equal to the reference's, else equal stripped text.
    Used only when rl-plugin-math is not installed; it knows no LaTeX."""
    if reference is None:
        return None
    ref = _final(str(reference))
    got = _final(completion)
    ref_n, got_n = _last_number(ref), _last_number(got)
    if ref_n is not None:
        return got_n == ref_n
    return got.strip() == ref.strip()


def default_accuracy() -> AccuracyFn:
    """rl-plugin-math's ``is_correct`` when installed, else :func:`fallback_is_correct`."""
    try:
        from rl_plugin_math import is_correct
    except ImportError:
        return fallback_is_correct
    return is_correct


def resolve_accuracy(accuracy: AccuracyFn | str | None) -> AccuracyFn:
    """The accuracy function a scheduler uses, from its ``accuracy`` option."""
    if accuracy is None:
        return default_accuracy()
    if callable(accuracy):
        return accuracy
    if isinstance(accuracy, str) and ":" in accuracy:
        modname, _, attr = accuracy.partition(":")
        try:
            obj: Any = importlib.import_module(modname)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"accuracy {accuracy!r} could not be loaded: {exc}") from exc
        if callable(obj):
            return obj
    raise ConfigError(f"accuracy must be a function or a 'module:function' string, got {accuracy!r}")


def reference_of(trajectory: Trajectory, key: str | None = None) -> Any:
    """The row's reference answer: column ``key`` if given, else ``solution``, else ``answer``."""
    if key is not None:
        return trajectory.data.get(key)
    for k in REFERENCE_KEYS:
        if trajectory.data.get(k) is not None:
            return trajectory.data[k]
    return None


def judge(accuracy: AccuracyFn, text: str, reference: Any) -> bool:
    """True only for a confident "correct"; no reference or a raising check counts as not correct
    (the schedulers then tip, which is harmless) rather than crashing the rollout."""
    if reference is None:
        return False
    try:
        return bool(accuracy(text, reference))
    except Exception:  # noqa: BLE001 - a user check that raises on odd text must not fail the trajectory
        return False


class MathAccuracy:
    """ms-swift's ``MathAccuracy`` call shape (``swift.rewards.orm`` in 4.x, ``swift.plugin.orm`` in
    3.x): ``MathAccuracy()(completions, solution) -> [1.0 or 0.0, ...]``, so an ms-swift scheduler
    body that builds one (its tip schedulers do) runs with the import changed. Judged by
    :func:`judge` with this package's accuracy (rl-plugin-math's ``is_correct`` when installed)."""

    def __init__(self, accuracy: AccuracyFn | str | None = None) -> None:
        self.accuracy = resolve_accuracy(accuracy)

    def __call__(self, completions: list[str], solution: list[Any], **kwargs: Any) -> list[float]:
        return [1.0 if judge(self.accuracy, str(c), s) else 0.0 for c, s in zip(completions, solution)]
