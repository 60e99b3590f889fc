"""The trainer: :class:`GRPOTrainer`, TRL's GRPO trainer API built on the loop API's calls
(:mod:`rlcore.loop`: sample, score, forward_backward, clip_grad_and_step, sync_weights).

:mod:`.grpo` holds the trainer class and its step; what a step does not need to know lives beside it.
"""

from __future__ import annotations

from ..training.config import GRPOConfig
from .grpo import GRPOTrainer, high_entropy_mask

__all__ = ["GRPOConfig", "GRPOTrainer", "high_entropy_mask"]
