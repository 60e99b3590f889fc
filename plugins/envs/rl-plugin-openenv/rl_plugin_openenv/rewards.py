"""``openenv_reward``: the environment's own reward, summed over the episode's steps."""

from __future__ import annotations


def openenv_reward(total_reward: list[float]) -> list[float]:
    """Cumulative OpenEnv reward (``sum(step_rewards)``) of each trajectory, as recorded by the scheduler."""
    return [float(r) for r in total_reward]
