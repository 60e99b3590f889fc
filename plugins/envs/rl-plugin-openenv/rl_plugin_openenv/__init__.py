"""rl-plugin-openenv: OpenEnv environments for rlcore.

This module is the plugin as rlcore sees it (pluggy's eggsample shape): registration hooks that
name lazily imported factories, so loading the plugin imports neither openenv nor websockets
until a run uses them. What it adds:

* scheduler ``openenv_scheduler`` — multi-turn rollouts against an OpenEnv server, one WebSocket
  session per trajectory (:mod:`rl_plugin_openenv.scheduler`);
* scheduler ``openenv_tool_scheduler`` — the same, with the environment's actions (or MCP tools)
  exposed as tool calls through :class:`rlcore.rollout.EnvTool` (:mod:`rl_plugin_openenv.tools`);
* env ``openenv`` — the per-trajectory :class:`~rl_plugin_openenv.env.OpenEnvEnv`;
* reward ``openenv_reward`` — the cumulative environment reward of each trajectory (rlcore's
  ``env_reward`` under this package's name);
* command ``rlcore openenv serve NAME --port P`` — this package's own environment servers.
"""

from __future__ import annotations

from typing import Any, Callable

import rlcore

__version__ = "0.1.0"


@rlcore.hookimpl
def register_schedulers(register: Callable[..., None]) -> None:
    register("openenv_scheduler", "rl_plugin_openenv.scheduler:OpenEnvScheduler")
    register("openenv_tool_scheduler", "rl_plugin_openenv.tools:OpenEnvToolScheduler")


@rlcore.hookimpl
def register_envs(register: Callable[..., None]) -> None:
    register("openenv", "rl_plugin_openenv.env:OpenEnvEnv")


@rlcore.hookimpl
def register_rewards(register: Callable[..., None]) -> None:
    # rlcore's env_reward under this plugin's name: one implementation, the name says which plugin a config means
    register("openenv_reward", "rlcore.rewards:env_reward",
             description="cumulative OpenEnv reward of the trajectory (sum of step rewards; rlcore's env_reward)")


@rlcore.hookimpl
def register_commands(cli: Any) -> None:
    from .commands import add_commands

    add_commands(cli)
