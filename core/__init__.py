"""rlcore: GRPO-family RL for LLMs with multi-turn rollouts, where everything you swap is a plugin."""

from __future__ import annotations

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
from .plugins import RunHooks, available, get, plugins, reload_plugins
from .types import Batch, ChatMessage, Completion, Prompt, SamplingParams, Trajectory, Turn

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``rlcore.GRPOTrainer`` / ``rlcore.GRPOConfig`` without importing torch at ``import rlcore``."""
    if name in ("GRPOConfig", "GRPOTrainer"):
        from . import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'rlcore' has no attribute {name!r}")

__all__ = [
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
