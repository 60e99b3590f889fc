"""rlcore: GRPO-family RL for LLMs with multi-turn rollouts, where everything you swap is a plugin."""

from __future__ import annotations

from .compat import moved as _moved

_moved.install()  # old import paths of moved modules keep working, with a DeprecationWarning

from .errors import (
    ConfigError,
    DatasetError,
    EnvError,
    MissingDependencyError,
    PluginError,
    RewardFunctionError,
    RlcoreError,
    RunFailedError,
    SamplerError,
    UnknownComponentError,
)
from .hookspecs import hookimpl, hookspec
from . import plugins  # the module; calling it (``rlcore.plugins()``) returns the loaded plugin set
from .plugins import RunHooks, available, get, reload_plugins
from .types import Batch, ChatMessage, Completion, Prompt, SamplingParams, Trajectory, Turn
# the base classes a plugin subclasses (DESIGN: every one is importable from ``rlcore``)
from .envs import Env, EnvStep
from .rewards import Reward
from .rollout import (
    EnvScheduler,
    ResponseChoice,
    RolloutOutput,
    ToolCall,
    ToolParser,
    ToolScheduler,
    check_batch,
    check_trajectory,
    run_rollouts,
)
# ms-swift's base classes and names: a scheduler ported from ms-swift imports them from here
from .compat.swift import Messages, MultiTurnScheduler, RolloutScheduler
from .sampling.base import Sampler

_moved.install_names()  # names that left a module (rlcore.rollout.remove_response …), kept working

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``rlcore.GRPOTrainer`` / ``rlcore.GRPOConfig`` without importing torch at ``import rlcore``."""
    if name in ("GRPOConfig", "GRPOTrainer"):
        from . import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'rlcore' has no attribute {name!r}")

__all__ = [
    "Env",
    "EnvScheduler",
    "EnvStep",
    "Messages",
    "MultiTurnScheduler",
    "ResponseChoice",
    "Reward",
    "RolloutOutput",
    "RolloutScheduler",
    "Sampler",
    "ToolCall",
    "ToolParser",
    "ToolScheduler",
    "check_batch",
    "check_trajectory",
    "run_rollouts",
    "Batch",
    "ChatMessage",
    "Completion",
    "GRPOConfig",
    "GRPOTrainer",
    "ConfigError",
    "DatasetError",
    "EnvError",
    "MissingDependencyError",
    "PluginError",
    "Prompt",
    "RewardFunctionError",
    "RlcoreError",
    "RunFailedError",
    "RunHooks",
    "SamplerError",
    "SamplingParams",
    "Trajectory",
    "Turn",
    "UnknownComponentError",
    "__version__",
    "available",
    "get",
    "hookimpl",
    "hookspec",
    "plugins",
    "reload_plugins",
]
