"""rl-plugin-reasoning-gym: reasoning-gym's procedural tasks as rlcore data and rewards.

This module is the plugin (the ``rlcore`` entry point names it). It only registers names, as
``"module:attr"`` strings, so ``rlcore plugins`` neither imports reasoning-gym (several seconds)
nor breaks when it is missing: the first use of a name says how to install it.
"""

from __future__ import annotations

from typing import Callable

from rlcore import hookimpl

__all__ = ["register_datasets", "register_rewards"]


@hookimpl
def register_datasets(register: Callable[..., None]) -> None:
    register("reasoning_gym", "rl_plugin_reasoning_gym.source:reasoning_gym_source",
             description="reasoning-gym tasks: reasoning_gym:NAME?size=…&seed=…, composites NAME:W,NAME:W")


@hookimpl
def register_rewards(register: Callable[..., None]) -> None:
    register("reasoning_gym", "rl_plugin_reasoning_gym.reward:ReasoningGymReward",
             description="the generating task's own score_answer")
    register("reasoning_gym_format", "rl_plugin_reasoning_gym.reward:ReasoningGymFormat",
             description="<answer>…</answer> (optionally after <think>…</think>)")
