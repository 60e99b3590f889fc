"""Rewards called straight on a list of trajectories:

    rewards = Rewards(["gsm8k_accuracy", "gsm8k_format"])
    values = rewards(trajectories)         # weighted sum per trajectory (None: nobody could score it)
    values = rewards(trajectories, step=s, max_steps=n)   # rewards that name ``step``/``progress`` see them

The same scorer the trainer runs (:func:`rlcore.rewards.compute_rewards`): each reward gets the
arguments its signature names, a sample that raises is scored ``None`` and counted, and every
trajectory keeps its named columns in ``trajectory.rewards`` and the weighted sum in ``.reward``.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..asyncutil import run_sync
from ..errors import ConfigError
from ..plugins import RunHooks
from ..rewards import RewardContext, compute_rewards
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

    def __call__(self, trajectories: Sequence[Trajectory], *, step: int | None = None, max_steps: int | None = None,
                 trainer_state: Any = None) -> list[float | None]:
        """Score ``trajectories``: their weighted reward each (also stored on them); the named
        columns of this call are in :attr:`columns`.

        A loop that trains says where it is, for rewards that see training progress: ``step`` (the
        optimizer steps done) and ``max_steps`` give the rewards' ``step`` and ``progress``
        (``step / max_steps``), and ``trainer_state`` (a ``transformers.TrainerState`` with
        ``global_step`` and ``max_steps`` set from them unless passed) for TRL-style rewards.
        Without them a reward sees step 0, progress 0 and ``trainer_state=None``."""
        trajs = list(trajectories)
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ConfigError(f"Rewards(step={step!r}): step is the number of optimizer steps done, an int >= 0")
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
            raise ConfigError(f"Rewards(max_steps={max_steps!r}): max_steps is the run's step bound, an int >= 1")
        if trainer_state is None and step is not None:
            from transformers import TrainerState

            trainer_state = TrainerState(global_step=step, max_steps=max_steps or 0)
        context = RewardContext(trainer_state=trainer_state, step=step, max_steps=max_steps)
        for r in self.rewards:
            if hasattr(r, "trainer_state"):
                r.trainer_state = trainer_state
            r.context = context
        hooks = RunHooks(*self.rewards, observers=self.observers)
        self.columns = run_sync(compute_rewards(hooks, trajs, self.weights))
        return [t.reward for t in trajs]
