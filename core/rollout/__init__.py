"""Rollouts: schedulers (single/multi-turn, env-driven, tools) and the async driver that runs them.

Import cost stays low (no torch): registration modules import this package. ms-swift's names
(``remove_response``, ``invoke_async_hook``, the ms-swift base classes …) live in
:mod:`rlcore.compat.swift`; the old ``rlcore.rollout.<name>`` paths of those still answer, with a
deprecation warning (:data:`rlcore.compat.moved.MOVED_NAMES`).
"""

from .driver import RolloutResult, make_trajectories, run_rollouts
from .env_scheduler import EnvScheduler
from .assemble import RolloutOutput, RolloutOutputError, output_to_trajectory
from .invariants import Violation, check_batch, check_trajectory
from .scheduler import (
    MultiTurnScheduler,
    ResponseChoice,
    RolloutScheduler,
    apply_turn_end,
    build_scheduler,
)
from .stream import INLINE_ROLE, MessagesEditError, TokenStream
from ..chat_template import ChatTemplateError, encode_observation, encode_prompt, render, template_delta
from .tools import EnvTool, ToolCall, ToolManager, ToolScheduler, parse_tool_calls
from .tool_parsers import ToolParser, auto_tool_parser, make_tool_parser

__all__ = [
    "ResponseChoice",
    "RolloutOutputError",
    "Violation",
    "apply_turn_end",
    "check_batch",
    "check_trajectory",
    "output_to_trajectory",
    "INLINE_ROLE",
    "ChatTemplateError",
    "EnvScheduler",
    "EnvTool",
    "MessagesEditError",
    "MultiTurnScheduler",
    "RolloutOutput",
    "RolloutResult",
    "RolloutScheduler",
    "TokenStream",
    "ToolCall",
    "ToolManager",
    "ToolParser",
    "ToolScheduler",
    "auto_tool_parser",
    "build_scheduler",
    "encode_observation",
    "encode_prompt",
    "make_tool_parser",
    "make_trajectories",
    "parse_tool_calls",
    "render",
    "run_rollouts",
    "template_delta",
]
