"""rl-plugin-gym: gymnasium environments and text games for rlcore, with ``gym_scheduler``.

This module is the whole plugin as rlcore sees it (pluggy's eggsample shape): three registration
hooks naming lazily imported factories, so loading the plugin costs nothing until a run uses it.
"""

from __future__ import annotations

from typing import Callable

import rlcore

__version__ = "0.1.0"


@rlcore.hookimpl
def register_envs(register: Callable[..., None]) -> None:
    register("gymnasium", "rl_plugin_gym.gymnasium_env:GymnasiumEnv", aliases=("gym",),
             description="any gymnasium.make id as text (gym_id option); gymnasium ids also work as env names")
    register("guess_number", "rl_plugin_gym.guess_number:GuessNumberEnv",
             description="find a secret number with higher/lower feedback")
    register("frozen_lake", "rl_plugin_gym.presets:frozen_lake",
             description="FrozenLake-v1 on firm ice with progress shaping (gym_scheduler's default)")
    register("arithmetic_chain", "rl_plugin_gym.arithmetic_chain:ArithmeticChainEnv",
             description="keep a running total through a chain of small operations")


@rlcore.hookimpl
def register_schedulers(register: Callable[..., None]) -> None:
    register("gym_scheduler", "rl_plugin_gym.scheduler:GymScheduler",
             description="one text env per trajectory (env_config.name or --env), multi-turn")


@rlcore.hookimpl
def register_rewards(register: Callable[..., None]) -> None:
    # rlcore's env_reward under this plugin's name: one implementation, the name says which plugin a config means
    register("gym_reward", "rlcore.rewards:env_reward",
             description="cumulative env reward of the trajectory (sum of step rewards; rlcore's env_reward)")
