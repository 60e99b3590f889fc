"""Rollouts: schedulers (single/multi-turn, env-driven, tools) and the async driver that runs them.

Import cost stays low (no torch): registration modules import this package.
"""

from .driver import RolloutResult, make_trajectories, run_rollouts
from .env_scheduler import EnvScheduler
from .scheduler import (
    MultiTurnScheduler,
    RolloutOutput,
    RolloutScheduler,
    SchedulerHooks,
    build_scheduler,
    merge_turn_results,
)
from .stream import INLINE_ROLE, MessagesEditError, TokenStream
from .tokens import ChatTemplateError, encode_observation, encode_prompt, render, template_delta
from .tools import EnvTool, ToolCall, ToolManager, ToolScheduler, parse_tool_calls

__all__ = [
    "INLINE_ROLE",
    "ChatTemplateError",
    "EnvScheduler",
    "EnvTool",
    "MessagesEditError",
    "MultiTurnScheduler",
    "RolloutOutput",
    "RolloutResult",
    "RolloutScheduler",
    "SchedulerHooks",
    "TokenStream",
    "ToolCall",
    "ToolManager",
    "ToolScheduler",
    "build_scheduler",
    "encode_observation",
    "encode_prompt",
    "make_trajectories",
    "merge_turn_results",
    "parse_tool_calls",
    "render",
    "run_rollouts",
    "template_delta",
]
