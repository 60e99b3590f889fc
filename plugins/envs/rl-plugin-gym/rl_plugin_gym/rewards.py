"""``gym_reward``: the cumulative environment reward of each trajectory, under this plugin's name.

The same number as the built-in ``env_reward`` (the sum of ``step_rewards``, invalid-action
penalties included); the alias lets a config say which plugin's reward it means.
"""

from __future__ import annotations


def gym_reward(total_reward: list[float]) -> list[float]:
    """The sum of the env's step rewards, per trajectory."""
    return [float(r) for r in total_reward]
