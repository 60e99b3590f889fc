"""Rewards called straight on a list of trajectories:

    rewards = Rewards(["gsm8k_accuracy", "gsm8k_format"])
    values = rewards(trajectories)         # weighted sum per trajectory (None: nobody could score it)

The same scorer the trainer runs (:func:`rlcore.rewards.compute_rewards`): each reward gets the
arguments its signature names, a sample that raises is scored ``None`` and counted, and every
trajectory keeps its named columns in ``trajectory.rewards`` and the weighted sum in ``.reward``.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..asyncutil import run_sync
from ..errors import ConfigError
from ..plugins import RunHooks
from ..rewards import compute_rewards
from ..training.components import build_reward
from ..types import Trajectory

__all__ = ["Rewards", "build_reward"]


class Rewards:
    """Several rewards with weights (default 1 each), scored together on trajectories."""

    def __init__(self, rewards: Any, weights: Sequence[float] | None = None, *,
                 options: dict[str, dict[str, Any]] | None = None, observers: Sequence[str] = ()) -> None:
        specs = list(rewards) if isinstance(rewards, (list, tuple)) else [rewards]
        if not specs:
            raise ConfigError("Rewards needs at least one reward (a registered name or a function)")
        self.rewards = [build_reward(s, (options or {}).get(s) if isinstance(s, str) else None) for s in specs]
        names = [r.name for r in self.rewards]
        if len(set(names)) != len(names):
            raise ConfigError(f"two rewards share a name ({', '.join(names)}); names label columns and weights")
        w = list(weights) if weights is not None else [1.0] * len(names)
        if len(w) != len(names):
            raise ConfigError(f"{len(w)} weights for {len(names)} rewards; give one per reward")
        self.weights = dict(zip(names, map(float, w)))
        self.observers = tuple(observers)
        self.columns: dict[str, list[float | None]] = {}

    def __call__(self, trajectories: Sequence[Trajectory]) -> list[float | None]:
        """Score ``trajectories``: their weighted reward each (also stored on them); the named
        columns of this call are in :attr:`columns`."""
        trajs = list(trajectories)
        hooks = RunHooks(*self.rewards, observers=self.observers)
        self.columns = run_sync(compute_rewards(hooks, trajs, self.weights))
        return [t.reward for t in trajs]
