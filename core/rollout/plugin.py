"""Built-in schedulers, registered like any third-party plugin's.

Factories are ``"module:attr"`` strings so loading plugins stays cheap.
"""

from __future__ import annotations

from typing import Callable

from ..hookspecs import hookimpl


@hookimpl
def register_schedulers(register: Callable[..., None]) -> None:
    register("default", "rlcore.rollout.scheduler:RolloutScheduler", aliases=("single_turn",),
             description="one completion per prompt")
    register("multi_turn", "rlcore.rollout.scheduler:MultiTurnScheduler",
             description="many turns; subclass and override step/check_finished (ms-swift style)")
    register("tool_scheduler", "rlcore.rollout.tools:ToolScheduler", aliases=("tool_call_scheduler",),
             description="runs <tool_call> JSON calls with registered tools until none remain or max_turns")
    register("env_scheduler", "rlcore.rollout.env_scheduler:EnvScheduler",
             description="one registered env per trajectory (--env NAME or env_config.name), multi-turn")
