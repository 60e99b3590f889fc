"""rl-plugin-tips: rollout schedulers that give a model a second chance on math problems.

This module is the plugin (the ``rlcore`` entry point names it): it registers the schedulers by
``"module:attr"`` so loading it stays cheap; the classes live in sibling modules.
"""

from __future__ import annotations

from typing import Callable

from rlcore import hookimpl

__all__ = ["register_schedulers"]


@hookimpl
def register_schedulers(register: Callable[..., None]) -> None:
    register("math_tip_trick", "rl_plugin_tips.tip_trick:MathTipTrick")
    register("thinking_tips_scheduler", "rl_plugin_tips.thinking_tips:ThinkingTipsScheduler")
