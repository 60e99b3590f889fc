"""rl-plugin-math: math rewards for rlcore.

This module is the plugin (the ``rlcore`` entry point names it). It only registers names; the
rewards live in sibling modules named as ``"module:attr"`` strings, so loading the plugin imports
neither sympy nor math-verify until a run asks for a reward.
"""

from __future__ import annotations

from typing import Callable

from rlcore import hookimpl

from .accuracy import is_correct

__all__ = ["is_correct", "register_rewards"]


@hookimpl
def register_rewards(register: Callable[..., None]) -> None:
    register("gsm8k_accuracy", "rl_plugin_math.gsm8k:gsm8k_accuracy")
    register("gsm8k_format", "rl_plugin_math.gsm8k:GSM8KFormat")
    register("math_accuracy", "rl_plugin_math.mathverify:MathAccuracy")
    register("cosine", "rl_plugin_math.cosine:Cosine")
    register("repetition", "rl_plugin_math.repetition:Repetition")
    register("soft_overlong", "rl_plugin_math.overlong:SoftOverlong")
